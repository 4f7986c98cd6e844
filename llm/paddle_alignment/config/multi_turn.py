"""Parameters of multi-turn rollouts with tools or environments (docs/multi_turn.md)."""

from dataclasses import dataclass, field

from paddle_alignment.agents.tools import TOOL_CALL_STYLES
from paddle_alignment.config.checks import check_import_paths
from paddle_alignment.config.layout import slices_weights


@dataclass
class MultiTurnArguments:
    """Parameters of multi-turn rollouts with tools or environments (docs/multi_turn.md): set `tools` or
    `environment` to turn them on."""

    tools: str = field(
        default="", metadata={"help": "Comma-separated tools the policy may call, each a typed, documented Python function as module:function (importable where the run starts; empty: single-turn rollouts)."}
    )
    tool_call_style: str = field(
        default="qwen", metadata={"help": "How tool calls are written: qwen (<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, Qwen2.5) or llama3 (a JSON object with name and parameters, Llama 3.1)."}
    )
    max_turns: int = field(default=4, metadata={"help": "Assistant turns per trajectory at most; max_dec_len bounds a trajectory's sampled and observation tokens together."})
    max_tool_response_tokens: int = field(default=256, metadata={"help": "A tool's answer is cut to this many tokens (and counted in multi_turn/observations_cut)."})
    tool_timeout: float = field(default=10.0, metadata={"help": "Seconds a tool call (or an environment's reset or step) may run before it is stopped: a tool answers with a timeout error, an environment's trajectory ends."})
    tool_workers: int = field(default=2, metadata={"help": "Worker processes running tool calls and environment steps (per rank or sampler)."})
    environment: str = field(
        default="", metadata={"help": "Comma-separated environments that answer each turn, each a subclass of paddle_alignment.agents.environments.Environment as module:Class; a data row picks one by class name in its `environment` column (with one, every row uses it). Instead of tools; its turn rewards add up to each trajectory's environment return, added to the reward source's score (no reward source: the return is the score)."}
    )
    turn_reward_discount: float = field(default=1.0, metadata={"help": "An environment return is the sum of discount**t x the reward of turn t (t from 0); 1.0: their sum."})

    def validate_multi_turn(self):
        if self.tool_call_style not in TOOL_CALL_STYLES:
            raise ValueError(f"tool_call_style={self.tool_call_style!r}: choose from {TOOL_CALL_STYLES}")
        check_import_paths(self.tool_paths, "tools", "module:function")
        check_import_paths(self.environment_paths, "environment", "module:Class")
        for key in ("max_turns", "max_tool_response_tokens", "tool_workers"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be positive, got {self.tool_timeout}")
        if self.tool_paths and self.environment_paths:
            raise ValueError("tools and environment together: an environment answers every turn itself (call the tools from its step)")
        if not 0 < self.turn_reward_discount <= 1:
            raise ValueError(f"turn_reward_discount must lie in (0, 1], got {self.turn_reward_discount}")
        if self.multi_turn and slices_weights(self):
            raise ValueError(
                "tools or environment (multi-turn rollouts) with sharding stage3: each rank's trajectories take their "
                "own number of turns, and every forward gathers the sliced weights from all ranks; use sharding "
                "stage1 or stage2"
            )

    @property
    def tool_paths(self):
        return [spec.strip() for spec in self.tools.split(",") if spec.strip()]

    @property
    def environment_paths(self):
        return [spec.strip() for spec in self.environment.split(",") if spec.strip()]

    @property
    def multi_turn(self):
        return bool(self.tool_paths or self.environment_paths)
