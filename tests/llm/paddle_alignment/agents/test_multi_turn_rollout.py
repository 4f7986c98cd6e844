"""Multi-turn rollouts (agents/rollout.py) with a scripted policy: the trainer gets the sampled ids as sampled and
the observation ids between them, masked out of training; budgets, failing and hanging tools end as counted,
never as a hung or silent run."""

import json
import os

import numpy as np
import pytest

import tool_samples
from helpers import REPO_ROOT
from llm.tools.build_real_tokenizer import build_real_tokenizer
from paddle_alignment.agents.chat_turns import observation_ids
from paddle_alignment.agents.rollout import TURN_STATS, TurnSettings, multi_turn_rollouts
from paddle_alignment.agents.tools import Tool, ToolBox
from paddle_alignment.models.loading import load_tokenizer
from paddle_alignment.rollout.decode import SamplingConfig, left_pad

import paddle


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen2.5_tokenizer"))
    build_real_tokenizer(folder, "qwen2", 151936)
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def toolbox():
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO_ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    box = ToolBox([Tool.from_function(f) for f in (tool_samples.add, tool_samples.hang)], timeout=1.0)
    yield box
    box.close()


def spelled(tokenizer, text):
    """`text` as ids of its characters one by one: what a policy may sample, which encoding the text never gives
    back (`<tool_call>` is one token of Qwen2.5's vocabulary)."""
    return [tokenizer.encode(char, add_special_tokens=False)["input_ids"][0] for char in text]


class ScriptedPolicy:
    """Samples turn k of `turns` (ids) for every running row, with log-prob -0.1 * (position + 1); records the
    inputs of each decode."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.inputs = tokenizer, turns, []

    def __call__(self, input_ids, prompt_mask, sampling, seed):
        self.inputs.append([row[mask > 0].tolist() for row, mask in zip(input_ids.numpy(), prompt_mask.numpy())])
        ids = self.turns[len(self.inputs) - 1][: sampling.max_dec_len]
        rows = len(input_ids)
        logprobs = [[-0.1 * (i + 1) for i in range(len(ids))]] * rows
        return paddle.to_tensor([ids] * rows, dtype="int64"), paddle.to_tensor(logprobs, dtype="float32")


def rollout(tokenizer, toolbox, turns, max_dec_len=1000, max_turns=4, n=2, max_tool_response_tokens=100):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2+40="}], tokenize=False, add_generation_prompt=True)
    items = [{"prompt": prompt, "label": "42", "input_ids": tokenizer.encode(prompt, add_special_tokens=False)["input_ids"]}]
    policy = ScriptedPolicy(tokenizer, turns)
    settings = TurnSettings(max_turns=max_turns, max_tool_response_tokens=max_tool_response_tokens, tool_call_style="qwen")
    exp = multi_turn_rollouts(policy, tokenizer, items, n, SamplingConfig(max_dec_len=max_dec_len), toolbox, settings, seed=3)
    stats = {name: exp.turn_stats[:, i].numpy().tolist() for i, name in enumerate(TURN_STATS)}
    return items[0]["input_ids"], exp, stats, policy


def test_the_trainer_gets_the_sampled_ids_as_sampled_and_the_observation_between_turns_masked(tokenizer, toolbox):
    call = spelled(tokenizer, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>') + [tokenizer.eos_token_id]
    answer = tokenizer.encode("42", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    prompt, exp, stats, policy = rollout(tokenizer, toolbox, [call, answer])
    observation = observation_ids(tokenizer, ["42"])
    trajectory = call + observation + answer
    response = exp.input_ids[:, exp.prompt_len :].numpy()
    for row in range(2):
        assert response[row, : len(trajectory)].tolist() == trajectory  # token in, token out
    assert policy.inputs[1] == [prompt + call + observation] * 2  # the second turn continued from exactly these
    mask = [1.0] * len(call) + [0.0] * len(observation) + [1.0] * len(answer)
    np.testing.assert_array_equal(exp.response_mask.numpy()[:, : len(mask)], [mask, mask])
    assert exp.attention_mask.numpy()[:, exp.prompt_len : exp.prompt_len + len(trajectory)].min() == 1
    logprobs = [-0.1 * (i + 1) for i in range(len(call))] + [0.0] * len(observation) + [-0.1 * (i + 1) for i in range(len(answer))]
    np.testing.assert_allclose(exp.rollout_logprobs.numpy()[0, : len(logprobs)], logprobs, rtol=1e-6)
    assert exp.responses == ["42", "42"] and exp.finished.numpy().tolist() == [True, True]
    # Micro-batches keep whole trajectories: their width counts the observation tokens too.
    trimmed = exp.trimmed()
    assert trimmed.input_ids[:, trimmed.prompt_len :].numpy()[0].tolist() == trajectory
    assert stats["turns"] == [2, 2] and stats["tool_calls"] == [1, 1] and stats["tool_errors"] == [0, 0]
    assert stats["observation_tokens"] == [len(observation)] * 2
    assert stats["rerender_differs"] == [1, 1]  # a re-tokenising rollout would have trained on other ids
    # Decoding the sampled call and encoding it again is not what was sampled:
    text = tokenizer.decode(call[:-1], skip_special_tokens=False)
    assert tokenizer.encode(text, add_special_tokens=False)["input_ids"] != call[:-1]


def test_a_failing_a_hanging_and_an_unreadable_call_are_answered_with_errors_and_counted(tokenizer, toolbox):
    eos = tokenizer.eos_token_id

    def calling(body):
        return tokenizer.encode(f"<tool_call>{body}</tool_call>", add_special_tokens=False)["input_ids"] + [eos]

    turns = [calling('{"name": "hang", "arguments": {"seconds": 30}}'), calling("{not json}"),
             calling('{"name": "add", "arguments": {"a": "x"}}'), tokenizer.encode("no", add_special_tokens=False)["input_ids"] + [eos]]
    _, exp, stats, _ = rollout(tokenizer, toolbox, turns, n=1)
    assert stats["turns"] == [4] and stats["tool_calls"] == [3] and stats["tool_timeouts"] == [1] and stats["tool_errors"] == [2]
    text = tokenizer.decode(exp.input_ids[0].numpy().tolist(), skip_special_tokens=False)
    assert "hang did not answer within 1 s" in text and "not valid JSON" in text and "argument a must be a JSON integer" in text


def test_budgets_end_a_trajectory_and_say_so(tokenizer, toolbox):
    eos = tokenizer.eos_token_id
    call = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', add_special_tokens=False)["input_ids"] + [eos]
    # max_turns 1: the call is the last turn, left unanswered; not truncated.
    _, exp, stats, _ = rollout(tokenizer, toolbox, [call], max_turns=1, n=1)
    assert stats["turns"] == [1] and stats["observation_tokens"] == [0] and stats["truncated"] == [0]
    # An answer over max_tool_response_tokens is cut and counted (the tokenizer has no merges: a token a character).
    eleven = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 10}}</tool_call>', add_special_tokens=False)["input_ids"]
    _, exp, stats, _ = rollout(tokenizer, toolbox, [eleven + [eos], [eos]], max_tool_response_tokens=1, n=1)
    text = tokenizer.decode(exp.input_ids[0].numpy().tolist(), clean_up_tokenization_spaces=False)
    assert stats["observations_cut"] == [1] and "<tool_response>\n1 ...(cut)\n</tool_response>" in text
    # A token budget that ends the first turn before its EOS.
    _, exp, stats, _ = rollout(tokenizer, toolbox, [call], max_dec_len=5, n=1)
    assert stats["truncated"] == [1] and exp.finished.numpy().tolist() == [False] and int(exp.response_mask.sum()) == 5
    # Room for the call but not for its answer and another turn.
    _, exp, stats, _ = rollout(tokenizer, toolbox, [call, call], max_dec_len=len(call) + 3, n=1)
    assert stats["truncated"] == [1] and stats["turns"] == [1] and stats["observation_tokens"] == [0]
