"""Multi-turn rollouts with tools: the tool interface, the parsing of tool calls and their execution."""
