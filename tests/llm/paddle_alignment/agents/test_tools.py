"""Tools of multi-turn rollouts (agents/tools.py): a typed function as a tool, tool calls parsed from sampled text
in Qwen2.5's and Llama 3.1's forms, and calls run in worker processes where a raising tool answers with its
error and a hanging one is stopped at the timeout."""

import os
import time

import pytest

import tool_samples
from helpers import REPO_ROOT
from paddle_alignment.agents.tools import Tool, ToolBox, ToolCall, ToolCallError, ToolResult, parse_tool_calls


def test_a_typed_function_becomes_a_tool_with_its_json_schema_and_descriptions():
    tool = Tool.from_function(tool_samples.add)
    assert tool.name == "add" and tool.description == "Add two integers." and tool.path == "tool_samples:add"
    assert tool.parameters == {
        "type": "object",
        "properties": {"a": {"type": "integer", "description": "the first addend."},
                       "b": {"type": "integer", "description": "the second addend."}},
        "required": ["a"],
    }
    assert tool.schema()["function"]["name"] == "add"
    lookup = Tool.from_function(tool_samples.lookup).parameters
    assert lookup["properties"] == {
        "key": {"type": "string"}, "keys": {"type": "array", "items": {"type": "string"}}, "scale": {"type": "number"},
        "strict": {"type": "boolean"}, "extra": {"type": "object"},
    }
    assert lookup["required"] == ["key", "keys"]


def untyped(x):
    """No annotation."""


def undocumented(x: int):
    pass


def variadic(*numbers: int):
    """Takes *args."""


@pytest.mark.parametrize("function, words", [
    (untyped, "parameter 'x' has no type annotation"),
    (undocumented, "give it a docstring"),
    (variadic, "must be a named argument"),
    (lambda x: x, "defined at the top of an importable module"),
])
def test_a_function_that_cannot_be_a_tool_is_refused_naming_why(function, words):
    with pytest.raises(TypeError, match=words):
        Tool.from_function(function)


@pytest.mark.parametrize("text, calls", [
    ("I will add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>",
     [ToolCall("add", {"a": 2, "b": 3})]),
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call><tool_call>{"name": "x"}</tool_call>',
     [ToolCall("add", {"a": 1}), ToolCall("x", {})]),
    ("The answer is 5.", []),
])
def test_qwen_tool_calls_are_parsed_from_the_sampled_text(text, calls):
    assert parse_tool_calls(text, "qwen") == calls


@pytest.mark.parametrize("text, calls", [
    ('<|python_tag|>{"name": "add", "parameters": {"a": 2}}', [ToolCall("add", {"a": 2})]),
    ('{"name": "add", "parameters": {"a": 2, "b": 5}}', [ToolCall("add", {"a": 2, "b": 5})]),
    ("The answer is 5.", []),
])
def test_llama3_tool_calls_are_parsed_from_the_sampled_text(text, calls):
    assert parse_tool_calls(text, "llama3") == calls


@pytest.mark.parametrize("text, style, words", [
    ("<tool_call>{\"name\": \"add\"", "qwen", "not closed"),
    ("<tool_call>{name: add}</tool_call>", "qwen", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "qwen", '"name" string'),
    ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "qwen", "must be a JSON object"),
    ("<|python_tag|>print(1)", "llama3", "JSON tool call"),
])
def test_a_call_that_cannot_be_read_is_an_error_the_model_reads(text, style, words):
    with pytest.raises(ToolCallError, match=words):
        parse_tool_calls(text, style)


@pytest.fixture
def toolbox(monkeypatch):
    tests = os.path.join(REPO_ROOT, "tests")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    tools = [Tool.from_function(f) for f in (tool_samples.add, tool_samples.divide, tool_samples.hang)]
    box = ToolBox(tools, timeout=2.0)
    yield box
    box.close()


def test_calls_run_in_a_worker_and_errors_come_back_as_observations(toolbox):
    assert toolbox.run(ToolCall("add", {"a": 2, "b": 40})) == ToolResult("42", "ok")
    assert toolbox.run(ToolCall("divide", {"a": 1, "b": 0})) == ToolResult("error: ZeroDivisionError: division by zero", "error")
    assert toolbox.run(ToolCall("mul", {"a": 1})) == ToolResult("error: there is no tool 'mul' (tools: add, divide, hang)", "error")
    assert toolbox.run(ToolCall("add", {"b": 1})).text == "error: add needs the argument a"
    assert toolbox.run(ToolCall("add", {"a": 1, "c": 2})).text == "error: add takes no argument c (it takes a, b)"
    assert toolbox.run(ToolCall("add", {"a": "1"})).text == 'error: add: argument a must be a JSON integer, got "1"'


def test_a_hanging_tool_is_stopped_at_the_timeout_and_the_next_call_is_answered(toolbox):
    started = time.monotonic()
    assert toolbox.run(ToolCall("hang", {"seconds": 60})) == ToolResult("error: hang did not answer within 2 s", "timeout")
    assert time.monotonic() - started < 10
    assert toolbox.run(ToolCall("hang", {"seconds": 0})) == ToolResult("woke", "ok")


def test_a_tool_the_workers_cannot_import_stops_the_run_at_start(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "")  # tests/ off the workers' path
    with pytest.raises(RuntimeError, match=r"tool add \(tool_samples:add\) does not load in a worker process: .*ModuleNotFoundError"):
        ToolBox([Tool.from_function(tool_samples.add)], timeout=2.0)
