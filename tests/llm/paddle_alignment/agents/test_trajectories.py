"""Multi-turn rollouts (agents/trajectories.py) with a scripted policy: the trainer gets the sampled ids as sampled and
the observation ids between them, masked out of training; budgets, failing and hanging tools end as counted,
never as a hung or silent run; environments (agents/environments.py) answer turns and reward them."""

import os

import numpy as np
import pytest

import tool_samples
from helpers import REPO_ROOT, TINY_CONFIG, built_paddlenlp_ops, overrides
from llm.alignment.ppo import run_ppo
from llm.tools.build_real_tokenizer import build_real_tokenizer
from paddle_alignment.agents.chat_turns import observation_ids
from paddle_alignment.agents.environments import Environments, environment_class, environment_path
from paddle_alignment.agents.trajectories import TURN_STATS, EnvironmentReplies, ToolReplies, TurnSettings, multi_turn_rollouts
from paddle_alignment.agents.tools import Tool, ToolBox
from paddle_alignment.deadline_workers import WorkerPool
from paddle_alignment.models.native_forward import SWITCH as NATIVE_SWITCH
from paddle_alignment.models.static_cache_decoder import StaticCacheDecoder
from paddle_alignment.models.loading import load_tokenizer
from paddle_alignment.rollout.decode import ROLLOUT_OPS, SamplingConfig

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

    def __call__(self, histories, caches, sampling, seed):
        self.inputs.append(histories)
        ids = self.turns[len(self.inputs) - 1][: sampling.max_dec_len]
        rows = len(histories)
        logprobs = [[-0.1 * (i + 1) for i in range(len(ids))]] * rows
        return paddle.to_tensor([ids] * rows, dtype="int64"), paddle.to_tensor(logprobs, dtype="float32"), None


def rollout(tokenizer, replies, turns, max_dec_len=1000, max_turns=4, n=2, max_tool_response_tokens=100, labels=("42",),
            discount=1.0):
    """The trajectories of `n` rollouts of a prompt per label, `replies` a ToolBox or EnvironmentReplies."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2+40="}], tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)["input_ids"]
    items = [{"prompt": prompt, "label": label, "input_ids": ids, "environment": SAMPLES + label_environment(label)} for label in labels]
    policy = ScriptedPolicy(tokenizer, turns)
    settings = TurnSettings(max_turns, max_tool_response_tokens, "qwen", turn_reward_discount=discount)
    if isinstance(replies, ToolBox):
        replies = ToolReplies(replies, settings.tool_call_style)
    exp = multi_turn_rollouts(policy, tokenizer, items, n, SamplingConfig(max_dec_len=max_dec_len), replies, settings, seed=3)
    stats = {name: exp.turn_stats[:, i].numpy().tolist() for i, name in enumerate(TURN_STATS)}
    return ids, exp, stats, policy


SAMPLES = "tool_samples:"


def label_environment(label):
    return "FailsAtSecondStep" if label in ("hang", "number", "fail") else "Countdown"


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


def test_the_last_turns_calls_are_not_run_when_no_turn_is_left_to_answer_them(tokenizer, toolbox):
    eos = tokenizer.eos_token_id
    hang = tokenizer.encode('<tool_call>{"name": "hang", "arguments": {"seconds": 30}}</tool_call>', add_special_tokens=False)["input_ids"]
    _, exp, stats, _ = rollout(tokenizer, toolbox, [hang + [eos]], max_turns=1, n=1)
    # A hang that ran would have timed out (and been counted): its answer could never be read.
    assert stats["turns"] == [1] and stats["tool_calls"] == [0] and stats["tool_timeouts"] == [0]
    assert exp.finished.numpy().tolist() == [True]


@pytest.fixture(scope="module")
def environments(toolbox):  # toolbox: tests/ on the workers' PYTHONPATH
    pool = WorkerPool("paddle_alignment.agents.tool_worker", "environment", 2, 1.0)
    yield EnvironmentReplies(Environments([SAMPLES + "Countdown", SAMPLES + "FailsAtSecondStep"], pool))
    pool.close()


def test_an_environment_answers_each_turn_as_a_user_turn_and_rewards_it(tokenizer, environments):
    turn = tokenizer.encode("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    prompt, exp, stats, policy = rollout(tokenizer, environments, [turn] * 3, labels=("3", "2"), n=1, discount=0.5)
    first_answer = tokenizer.encode("\n<|im_start|>user\nturns left: 2<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert policy.inputs[1][0] == prompt + turn + first_answer  # token in, token out: only the new turn appended
    assert stats["turns"] == [3, 2] and stats["env_errors"] == [0, 0]
    # Countdown rewards turn t with 10**t: returns 1 + 0.5 x 10 + 0.25 x 100 and 1 + 0.5 x 10.
    np.testing.assert_allclose(exp.env_returns.numpy(), [31.0, 6.0])
    mask = exp.response_mask.numpy()[0]
    assert mask.sum() == 3 * len(turn) and mask[len(turn) : len(turn) + len(first_answer)].sum() == 0
    assert exp.finished.numpy().tolist() == [True, True]


def test_an_environment_that_raises_hangs_or_answers_wrong_types_ends_its_trajectory_counted(tokenizer, environments):
    turn = tokenizer.encode("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    _, exp, stats, _ = rollout(tokenizer, environments, [turn] * 4, labels=("fail", "hang", "number"), n=1)
    # fail: step 2 raises; hang: step 3 passes the 1 s deadline; number: step 1 answers 7, not a text.
    assert stats["turns"] == [2, 3, 1] and stats["env_errors"] == [1, 1, 1]
    np.testing.assert_allclose(exp.env_returns.numpy(), [1.0, 2.0, 0.0])  # the rewards of the steps that answered


def test_a_row_names_its_environment_or_the_run_stops_naming_the_row():
    paths = [SAMPLES + "Countdown", SAMPLES + "GuessTheNumber"]
    assert environment_path(paths, "GuessTheNumber", "row 3") == SAMPLES + "GuessTheNumber"
    assert environment_path(paths[:1], "", "row 3") == SAMPLES + "Countdown"
    with pytest.raises(ValueError, match="row 3: name its environment in the column 'environment' \\(Countdown, GuessTheNumber\\)"):
        environment_path(paths, "", "row 3")
    with pytest.raises(ValueError, match="row 3: environment 'Chess' is not configured"):
        environment_path(paths, "Chess", "row 3")


def test_an_environment_class_must_subclass_environment_and_define_both_methods():
    assert environment_class(SAMPLES + "GuessTheNumber").__name__ == "GuessTheNumber"
    with pytest.raises(TypeError, match="define its step method"):
        environment_class(SAMPLES + "NoStep")
    with pytest.raises(TypeError, match="a subclass of paddle_alignment.agents.environments.Environment"):
        environment_class(SAMPLES + "add")
    with pytest.raises(ValueError, match="cannot load tool_samples:Missing: AttributeError"):
        environment_class(SAMPLES + "Missing")


@pytest.mark.parametrize("native", ["on", "off"])
def test_the_log_probs_of_every_turn_equal_a_fresh_forward_over_the_whole_trajectory(tiny_world, tmp_path, toolbox, monkeypatch, native):
    """The fast decode loop's log-probs of each turn, sampled after the earlier turns and the observations, are
    what the trainer's forward over the whole trajectory gives (1e-5): positions and ids continue across turns
    exactly, whether the KV cache carries from turn to turn (the native forward: a later turn prefills only its
    last sampled token and the observation) or each turn prefills the whole trajectory (the eager decoder).
    Countdown answers every turn, so each trajectory has max_turns turns."""
    built_paddlenlp_ops(ROLLOUT_OPS)
    monkeypatch.setenv(NATIVE_SWITCH, native)
    argv = overrides(tiny_world, str(tmp_path), use_rule_reward=False, environment=SAMPLES + "Countdown", max_turns=3,
                     max_dec_len=120, max_length=140, temperature=0.7, eval_datasets="")
    trainer = run_ppo.build_trainer([TINY_CONFIG, *argv])
    worker = trainer.rollout.worker
    items = [item for item in trainer.train_dataset.items if int(item["label"]) >= 3][:4]  # Countdown goes on 3 turns
    prefilled = []
    prefill = StaticCacheDecoder.prefill
    monkeypatch.setattr(StaticCacheDecoder, "prefill", lambda self, ids: prefilled.append(ids.shape) or prefill(self, ids))
    exp, _ = worker.generate_sequences(items, seed=5)
    stats = {name: exp.turn_stats[:, i].numpy() for i, name in enumerate(TURN_STATS)}
    assert stats["turns"].min() == 3 and stats["observation_tokens"].min() > 40 and stats["truncated"].max() == 0
    observation = max(len(observation_ids(worker.tokenizer, [f"turns left: {n}"], "user")) for n in range(20))
    widest_later_turn = max(width for _, width in prefilled[1:])
    if native == "on":  # the last sampled token and the observation, at most
        assert widest_later_turn <= observation + 1
    else:
        assert widest_later_turn > exp.prompt_len + observation
    forward = worker.compute_logprobs(worker.policy, exp).numpy()
    mask = exp.response_mask.numpy()
    np.testing.assert_allclose(exp.rollout_logprobs.numpy() * mask, forward * mask, rtol=1e-5, atol=1e-5)
    # Countdown's rewards 1, 10 and 100 are the scores: there is no other reward source.
    np.testing.assert_allclose(exp.scores.numpy(), [111.0] * 4 * 4)


def test_a_turn_that_ends_at_another_end_id_ends_the_conversation(tokenizer, toolbox):
    """Qwen2.5's generation_config.json ends responses at <|endoftext|> too: such a turn's calls are not run."""
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    call = tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', add_special_tokens=False)["input_ids"]
    tokenizer.end_token_ids = [tokenizer.eos_token_id, end_of_text]
    try:
        _, exp, stats, _ = rollout(tokenizer, toolbox, [call + [end_of_text] + [7, 8]], n=1)
    finally:
        del tokenizer.end_token_ids
    assert stats["turns"] == [1] and stats["tool_calls"] == [0] and stats["truncated"] == [0]
    assert exp.finished.numpy().tolist() == [True] and int(exp.response_mask.sum()) == len(call) + 1
