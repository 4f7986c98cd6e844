"""Tools a policy calls during a multi-turn rollout: a typed Python function is a tool.

    def calc(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: digits, + - * / and parentheses, e.g. "12*(3+4)".
        '''

    tool = Tool.from_function(calc)   # name, description, JSON-schema parameters (what the chat template shows)

The function must live in an importable module (not `__main__`, not a lambda or a nested function): it runs
in a worker process (deadline_workers.py), so a tool that hangs is killed at `tool_timeout` and one that
raises or gets bad arguments answers with an error the policy reads, never a hung run or a silent empty
answer. Calls are parsed from the sampled text in Qwen2.5's form (`<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`) or Llama 3.1's (a JSON object `{"name": ..., "parameters": {...}}`, after
`<|python_tag|>` or alone).
"""

import importlib
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass

from paddle_alignment.deadline_workers import CallFailed, DeadlineExceeded, WorkerPool

TOOL_CALL_STYLES = ("qwen", "llama3")
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
QWEN_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
LLAMA_PYTHON_TAG = "<|python_tag|>"


class ToolCallError(ValueError):
    """Sampled text that tries to call a tool and cannot be read as a call: its message is the observation."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back: `text` (the observation) and `status`: ok, error (the tool raised, or the call
    named an unknown tool or wrong arguments) or timeout."""

    text: str
    status: str


def json_type(annotation, where):
    """The JSON-schema type of a parameter annotation (str, int, float, bool, list[...], dict[...], X | None)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(options) == 1:
            return json_type(options[0], where)
    if origin is list:
        (item,) = typing.get_args(annotation) or (str,)
        return {"type": "array", "items": json_type(item, where)}
    if (origin or annotation) in JSON_TYPES:
        return {"type": JSON_TYPES[origin or annotation]}
    raise TypeError(f"{where}: annotate it with str, int, float, bool, list[...] or dict (got {annotation!r})")


def docstring_parts(function):
    """(summary, {argument: description}) from a Google-style docstring ("Args:" then "name: text" lines)."""
    doc = inspect.getdoc(function) or ""
    summary, _, rest = doc.partition("\nArgs:")
    described = {}
    for line in rest.splitlines():
        match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if match:
            described[match.group(1)] = match.group(2).strip()
        elif not line.strip() and described:
            break
    return " ".join(summary.split()), described


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of type "object"
    path: str  # "module:qualified_name", imported by the worker that runs it

    @classmethod
    def from_function(cls, function):
        where = f"tool {getattr(function, '__qualname__', function)!r}"
        qualname = getattr(function, "__qualname__", "")
        if not inspect.isfunction(function) or "<" in qualname or function.__module__ == "__main__":
            raise TypeError(f"{where}: a tool is a function defined at the top of an importable module (it runs in a worker process)")
        summary, described = docstring_parts(function)
        if not summary:
            raise TypeError(f"{where}: give it a docstring; its first lines describe the tool to the model")
        properties, required = {}, []
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
                raise TypeError(f"{where}: parameter {name!r} must be a named argument (no *args, **kwargs or /)")
            if parameter.annotation is parameter.empty:
                raise TypeError(f"{where}: parameter {name!r} has no type annotation")
            properties[name] = json_type(parameter.annotation, f"{where}, parameter {name!r}")
            if name in described:
                properties[name]["description"] = described[name]
            if parameter.default is parameter.empty:
                required.append(name)
        schema = {"type": "object", "properties": properties, "required": required}
        return cls(function.__name__, summary, schema, f"{function.__module__}:{qualname}")

    def schema(self):
        """The function schema chat templates show the model (Qwen2.5's and Llama 3.1's `tools=`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def argument_problem(self, arguments):
        """What is wrong with `arguments` for this tool, in words for the model; None when nothing is."""
        properties = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"{self.name} takes no argument {', '.join(unknown)} (it takes {', '.join(properties) or 'none'})"
        missing = [name for name in self.parameters["required"] if name not in arguments]
        if missing:
            return f"{self.name} needs the argument {', '.join(missing)}"
        for name, value in arguments.items():
            expected = properties[name]["type"]
            if not matches_json_type(value, expected):
                return f"{self.name}: argument {name} must be a JSON {expected}, got {json.dumps(value)}"
        return None


def matches_json_type(value, expected):
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    python = {"string": str, "boolean": bool, "array": list, "object": dict}[expected]
    return isinstance(value, python)


def call_from_json(text, arguments_key):
    """A ToolCall from the JSON object `text` with "name" and `arguments_key` (an object, or a JSON string of one)."""
    try:
        call = json.loads(text)
    except json.JSONDecodeError as error:
        raise ToolCallError(f"the tool call is not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ToolCallError('a tool call is a JSON object with a "name" string')
    arguments = call.get(arguments_key, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ToolCallError(f'the "{arguments_key}" of a tool call must be a JSON object') from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f'the "{arguments_key}" of a tool call must be a JSON object')
    return ToolCall(call["name"], arguments)


def parse_tool_calls(text, style):
    """The tool calls in the sampled `text` ([] when it calls none); ToolCallError when it tries and fails."""
    if style == "qwen":
        if text.count("<tool_call>") != len(QWEN_CALL.findall(text)):
            raise ToolCallError("a <tool_call> is not closed by </tool_call>")
        return [call_from_json(body.strip(), "arguments") for body in QWEN_CALL.findall(text)]
    if style == "llama3":
        body = text.split(LLAMA_PYTHON_TAG, 1)[1] if LLAMA_PYTHON_TAG in text else text
        body = body.strip()
        if not body.startswith("{"):
            if LLAMA_PYTHON_TAG in text:
                raise ToolCallError("after <|python_tag|> comes a JSON tool call")
            return []
        return [call_from_json(body, "parameters")]
    raise ValueError(f"tool call style {style!r}: choose from {TOOL_CALL_STYLES}")


def import_path(path):
    """The object at "module:qualified.name" (ImportError or AttributeError when there is none)."""
    module, _, name = path.partition(":")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def load_path(path, key):
    """The object at `path` of the config's `key`; ValueError naming both when it does not import."""
    try:
        return import_path(path)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{key}: cannot load {path}: {type(error).__name__}: {error}") from None


def load_tools(paths):
    """The Tools of the config's `tools` ("module:function" each)."""
    return [Tool.from_function(load_path(path, "tools")) for path in paths]


class ToolBox:
    """The tools of a run, called in `workers` worker processes, each call ended after `timeout` seconds."""

    def __init__(self, tools, timeout, workers=1):
        self.tools = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            raise ValueError(f"two tools share a name: {sorted(tool.name for tool in tools)}")
        self.timeout = timeout
        self.pool = WorkerPool("paddle_alignment.agents.tool_worker", "tool", workers, timeout)
        for tool in tools:  # a tool the workers cannot import is the config's error, not the model's
            try:
                self.pool.call({"path": tool.path, "check": True})
            except (RuntimeError, DeadlineExceeded) as error:
                raise RuntimeError(
                    f"tool {tool.name} ({tool.path}) does not load in a worker process: {error or 'no answer'}; its "
                    "module must be importable there (on PYTHONPATH)"
                ) from None

    def run(self, call):
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(f"error: there is no tool {call.name!r} (tools: {', '.join(self.tools)})", "error")
        problem = tool.argument_problem(call.arguments)
        if problem is not None:
            return ToolResult(f"error: {problem}", "error")
        try:
            return ToolResult(self.pool.call({"path": tool.path, "arguments": call.arguments}), "ok")
        except DeadlineExceeded:
            return ToolResult(f"error: {call.name} did not answer within {self.timeout:g} s", "timeout")
        except CallFailed as error:  # the tool raised
            return ToolResult(f"error: {error.error}", "error")
        except RuntimeError as error:  # its worker died during the call (the tool ended the process)
            return ToolResult(f"error: {error}", "error")

    def close(self):
        self.pool.close()
