"""Scale-out on CPU: parallel-degree validation, log-probs and entropy with vocab-parallel logits over a
real 2-process group, and a 2-process data-parallel GRPO step against a 1-process step on the same
global batch."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import REPO_ROOT, launch_two_processes, small_run_argv
from llm.alignment.ppo.arguments import check_parallel_degrees

PROBES = os.path.join(REPO_ROOT, "tests", "probes")
TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")


def layout(**changes):
    values = {"tensor_parallel_degree": -1, "pipeline_parallel_degree": -1, "sharding": "", "sharding_parallel_degree": -1,
              "sequence_parallel": False}
    return SimpleNamespace(**{**values, **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {"tensor_parallel_degree": 8},
        {"tensor_parallel_degree": 2, "sharding": "stage1", "sharding_parallel_degree": 4},
        {"tensor_parallel_degree": 4, "pipeline_parallel_degree": 2, "sequence_parallel": True},
        {"sharding": "stage3"},
        {"pipeline_parallel_degree": 2},
    ],
)
def test_parallel_layouts_of_eight_gpus_pass(changes):
    check_parallel_degrees(layout(**changes), world_size=8, on_accelerator=True)


@pytest.mark.parametrize(
    "changes, world, message",
    [
        ({"tensor_parallel_degree": 3}, 8, "tensor_parallel_degree=3 = 3 ranks per data-parallel replica does not divide the 8"),
        (
            {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "sharding": "stage2", "sharding_parallel_degree": 4},
            8,
            "tensor_parallel_degree=2 x pipeline_parallel_degree=2 x sharding_parallel_degree=4 = 16",
        ),
        ({"tensor_parallel_degree": 2}, 1, "does not divide the 1 launched"),
        ({"sequence_parallel": True}, 8, "sequence_parallel .* needs tensor_parallel_degree >= 2"),
    ],
)
def test_inconsistent_parallel_degrees_fail_naming_the_keys(changes, world, message):
    with pytest.raises(ValueError, match=message):
        check_parallel_degrees(layout(**changes), world_size=world, on_accelerator=True)


@pytest.mark.parametrize("changes", [{"tensor_parallel_degree": 2}, {"pipeline_parallel_degree": 2}, {"sharding": "stage1"}])
def test_model_parallel_on_cpu_says_it_needs_gpus(changes):
    with pytest.raises(ValueError, match="need GPUs .* on CPU only data parallel runs"):
        check_parallel_degrees(layout(**changes), world_size=2, on_accelerator=False)


def test_a_cpu_config_with_tensor_parallel_stops_at_parse(tmp_path):
    from test_config import parse

    with pytest.raises(ValueError, match="tensor_parallel_degree=2 .* does not divide the 1 launched"):
        parse(tmp_path, tensor_parallel_degree=2)
    with pytest.raises(ValueError, match="need GPUs"):
        parse(tmp_path, sharding="stage1")


@pytest.mark.slow
def test_vocab_parallel_logprobs_and_entropy_match_full_vocabulary(tmp_path):
    """Each of 2 gloo ranks holds half the vocabulary; values and gradients equal the full computation."""
    output = tmp_path / "difference.json"
    launch_two_processes(str(output), [], tmp_path / "log", script=os.path.join(PROBES, "vocab_parallel.py"))
    difference = json.loads(output.read_text())
    assert difference["grad_norm"] > 0.1  # the gradients compared are not trivially zero
    assert difference["logprobs"] < 1e-5 and difference["entropy"] < 1e-5 and difference["grad"] < 1e-6, difference


@pytest.mark.slow
def test_two_process_grpo_step_equals_one_process_on_the_same_global_batch(tiny_world, tmp_path):
    """The first GRPO step's loss, gradient norm and rollout metrics: 2 ranks x 4 prompts (gradients averaged
    by data parallel) against 1 rank x 8 prompts. Rollouts are fixed (tests/probes/grpo_first_step.py).
    With token-mean every response token of the step weighs the same whichever rank holds it (verl's
    global token mean): the ranks hold different numbers of tokens, so a per-rank mean would differ."""
    probe = os.path.join(PROBES, "grpo_first_step.py")
    shared = {"use_rm_server": "false", "use_rule_reward": "true", "loss_agg_mode": "token-mean", "max_steps": 1}

    def argv(run, prompts_per_rank):
        return small_run_argv(
            tiny_world, str(tmp_path / run), per_device_prompt_batch_size=prompts_per_rank,
            per_device_train_batch_size=4 * prompts_per_rank, **shared,
        )

    single = tmp_path / "single.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, probe, str(single), TINY_CONFIG, *argv("single", 8)], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    double = tmp_path / "double.json"
    launch_two_processes(str(double), [TINY_CONFIG, *argv("double", 4)], tmp_path / "log", script=probe)

    one, two = json.loads(single.read_text()), json.loads(double.read_text())
    rank_tokens = [json.loads((tmp_path / f"double.json.rank{rank}").read_text())["response_tokens"] for rank in (0, 1)]
    assert rank_tokens[0] != rank_tokens[1], rank_tokens  # so a mean of per-rank token means would differ
    assert one["grad_norm"] > 1e-3 and 0 < one["accuracy"] < 1  # a real gradient from mixed rewards
    for key in ["loss/policy_avg", "grad_norm", "reward_mean", "accuracy", "response_length_mean"]:
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    # The entropy statistic is a mean over each rank's tokens, then over ranks: ranks with fewer tokens
    # weigh a little more, so it agrees less closely.
    assert two["entropy"] == pytest.approx(one["entropy"], rel=1e-3)


@pytest.mark.slow
def test_advantages_are_whitened_over_every_data_parallel_rank(tmp_path):
    """REINFORCE++ and GAE whiten over the global batch, as verl does: each of 2 ranks' half equals the
    NumPy whitening (verl's masked_whiten, unbiased variance) of the whole batch."""
    from test_ppo_algos import numpy_gae

    output = tmp_path / "whitened.json"
    launch_two_processes(str(output), [], tmp_path / "log", script=os.path.join(PROBES, "whiten_over_ranks.py"))
    ranks = [json.loads((tmp_path / f"whitened.json.rank{rank}").read_text()) for rank in (0, 1)]
    rewards, values, mask = (np.array(ranks[0][key], dtype="float64") for key in ("rewards", "values", "mask"))
    lengths = mask.sum(axis=1).astype(int)
    last_token_rewards = np.zeros_like(mask)
    last_token_rewards[np.arange(len(lengths)), lengths - 1] = rewards

    def whiten(x):
        valid = x[mask == 1]
        return (x - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8) * mask

    reward_to_go = np.cumsum(last_token_rewards[:, ::-1], axis=1)[:, ::-1] * mask  # gamma 1
    expected = {
        "reinforce_plus_plus": whiten(reward_to_go),
        "gae": whiten(numpy_gae(last_token_rewards, values * mask, lengths, 1.0, 0.95)),
    }
    for name, whole in expected.items():
        both = np.concatenate([np.array(ranks[0][name]), np.array(ranks[1][name])])
        np.testing.assert_allclose(both, whole, rtol=1e-4, atol=1e-5, err_msg=name)
        half = whole[:3][mask[:3] == 1]
        assert abs(half.mean()) > 0.05  # a rank's own whitening (mean 0 on its rows) would differ
