"""The tiny tool task's world: the tokenizer with Qwen2.5's tool tags and merges, the `calc` tool, and the
products' data (llm/tools/gen_calc.py)."""

import json
import re

import pytest

from llm.tools.build_tokenizer import build_tokenizer
from llm.tools.gen_calc import generate
from paddle_alignment.agents.calculator import calc
from paddle_alignment.agents.tools import Tool, parse_tool_calls
from paddle_alignment.chat_format import chat_prompt, render_chat, tool_call_text


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    return build_tokenizer(str(tmp_path_factory.mktemp("tool_tokenizer")), tool_tags=True)


def rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_tool_tags_are_single_tokens_that_stay_in_decoded_text(tool_tokenizer):
    call = tool_call_text("calc", {"expression": "12*34"})
    ids = tool_tokenizer.encode(call, add_special_tokens=False)["input_ids"]
    tags = tool_tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    assert ids[0] == tags[0] and ids[-1] == tags[1] and len(ids) < len(call) / 2
    assert tool_tokenizer.decode(ids, skip_special_tokens=True) == call
    assert parse_tool_calls(tool_tokenizer.decode(ids, skip_special_tokens=True), "qwen")[0].arguments == {"expression": "12*34"}


def test_decoding_and_encoding_again_is_not_the_identity(tool_tokenizer):
    """A policy may spell `name` byte by byte; its text encodes back to the merged token: a toolkit that
    re-tokenises would train on ids that were never sampled."""
    spelled = [tool_tokenizer.convert_tokens_to_ids(letter) for letter in "name"]
    text = tool_tokenizer.decode(spelled)
    assert text == "name"
    assert tool_tokenizer.encode(text, add_special_tokens=False)["input_ids"] == [tool_tokenizer.convert_tokens_to_ids("name")]


def test_the_chat_template_renders_tool_answers_as_qwen25_does(tool_tokenizer):
    messages = [
        {"role": "user", "content": "12*34="},
        {"role": "assistant", "content": tool_call_text("calc", {"expression": "12*34"})},
        {"role": "tool", "content": "408"},
        {"role": "tool", "content": "1"},
    ]
    rendered = tool_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == render_chat(messages)
    assert rendered.endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\n1\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tool_tokenizer.encode(rendered, add_special_tokens=False)["input_ids"]
    assert tool_tokenizer.decode(ids) == rendered


def test_calc_computes_integer_arithmetic_and_refuses_anything_else():
    assert calc("12*(3+4)") == "84" and calc(" -7 * 8 ") == "-56" and calc("99*99") == "9801"
    for expression, message in [
        ("2**10", "is not allowed"), ("__import__('os')", "is not allowed"), ("7/2", "is not allowed"),
        ("1.5*2", "is not allowed"), ("12*", "cannot read"), ("1" * 201, "longer than 200"),
    ]:
        with pytest.raises(ValueError, match=message):
            calc(expression)
    schema = Tool.from_function(calc).parameters
    assert schema["properties"]["expression"]["type"] == "string" and schema["required"] == ["expression"]


def test_the_products_data_holds_out_its_eval_prompts_and_calls_the_tool_on_its_share(tmp_path):
    generate(str(tmp_path), num_eval=100, num_sft=2000, tool_rate=0.3, seed=1)
    train, evaluation = rows(tmp_path / "rl" / "train.jsonl"), rows(tmp_path / "rl" / "eval.jsonl")
    assert len(train) + len(evaluation) == 90 * 90 and len(evaluation) == 100
    assert not {r["src"] for r in train} & {r["src"] for r in evaluation}
    for row in train[:50] + evaluation:
        a, b = map(int, re.search(r"(\d+)\*(\d+)=", row["src"]).groups())
        assert row["src"] == chat_prompt(f"{a}*{b}=") and int(row["tgt"]) == a * b
    sft = rows(tmp_path / "sft" / "train.json")
    calls = [r for r in sft if r["tgt"].startswith("<tool_call>")]
    answers_after_the_tool = [r for r in sft if "<tool_response>" in r["src"]]
    # A tool demonstration is two rows: the call, and the answer after the tool's.
    assert len(calls) == len(answers_after_the_tool) and len(sft) == 2000 + len(calls)
    assert abs(len(calls) / 2000 - 0.3) < 0.04
    for row in answers_after_the_tool:
        assert f"<tool_response>\n{row['tgt']}\n</tool_response>" in row["src"]
    sft_prompts = {r["src"] for r in sft if "<tool_response>" not in r["src"]}
    assert not sft_prompts & {r["src"] for r in evaluation}
    dev = rows(tmp_path / "sft" / "dev.json")
    assert [r["src"] for r in dev[::2]] == [r["src"] for r in evaluation]
    assert all(r["tgt"].startswith("<tool_call>") for r in dev[::2]) and all("<tool_response>" in r["src"] for r in dev[1::2])
