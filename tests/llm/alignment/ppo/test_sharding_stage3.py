"""Sharding stage 3 (paddle's group_sharded_parallel, p_g_os) over 2 CPU processes, through
tests/probes/stage3_on_cpu.py (paddle's stage-3 engine with its device asserts passed; every weight of the
tiny model sliced): a GRPO and a PPO step against one process on the same global batch, and a run with
uneven evaluation shards and checkpoints that resumes exactly."""

import json
import os
import shutil

import numpy as np
import pytest

from helpers import FIRST_STEP_PROBE, REPO_ROOT, RUN_PPO, TINY_CONFIG, first_step, launch_two_processes, small_run_argv
from test_parallel import assert_resumed_run_ends_as_uninterrupted, optimizer_arrays, step_metrics

STAGE3_ON_CPU = os.path.join(REPO_ROOT, "tests", "probes", "stage3_on_cpu.py")
# Paddle's stage-3 clip reads a GPU device id (the probe's docstring); weight decay checks that the sliced
# parameters, which stage 3 steps under other names, still decay.
STEP = {"max_grad_norm": 0, "weight_decay": 0.1}
STAGE3 = {"sharding": "stage3", "sharding_parallel_degree": 2}


def stage3_first_step(world, tmp_path, **changes):
    """helpers.first_step over 2 processes under sharding stage 3 (the probe runs grpo_first_step.py)."""
    prompts = 4
    argv = small_run_argv(
        world, str(tmp_path / "stage3"), per_device_prompt_batch_size=prompts, per_device_train_batch_size=4 * prompts,
        use_rm_server="false", use_rule_reward="true", loss_agg_mode="token-mean", max_steps=1, **STAGE3, **changes,
    )
    output = tmp_path / "stage3.json"
    launch_two_processes(FIRST_STEP_PROBE, [str(output), TINY_CONFIG, *argv], tmp_path / "stage3_log", script=STAGE3_ON_CPU)
    return output


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [{"rl_algorithm": "grpo"}, {"rl_algorithm": "ppo"}, {"rl_algorithm": "grpo", "lora": "true", "lora_rank": 4, "recompute": "true"}],
    ids=["grpo", "ppo", "grpo-lora-recompute"],
)
def test_sharding_stage3_step_equals_one_process_on_the_same_global_batch(tiny_world, tmp_path, changes):
    """Each rank keeps slices of the weights and of the optimizer's states; every forward gathers its layer's
    weights and every backward reduces their gradients to the slices. Against 1 process on the same 8 prompts:
    the loss, the gradient norms of the whole batch (measured inside stage 3's step), the weights after it.
    PPO's critic is sliced too; with LoRA only the adapters train (and are sliced), the reference being the
    policy with them off."""
    one = first_step(tiny_world, tmp_path, "one", processes=1, **changes, **STEP)
    output = stage3_first_step(tiny_world, tmp_path, **changes, **STEP)
    two = json.loads(output.read_text())
    keys = ["loss/policy_avg", "grad_norm", "reward_mean", "accuracy"]
    keys += ["loss/value_avg", "critic_grad_norm"] if changes["rl_algorithm"] == "ppo" else []
    assert one["grad_norm"] > 1e-3
    for key in keys:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    names = sorted(one["weights"])
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=1e-5)
    # Each rank's optimizer holds half the sliced parameters' states (padded to stage 3's alignment) and all of
    # the small parameters' (biases, norms, LoRA's A matrices): 50.5% of the states of the GRPO step, 73% with LoRA.
    whole = json.loads((tmp_path / "one.json.rank0").read_text())["optimizer_state_elements"]
    for rank in (0, 1):
        held = json.loads((tmp_path / f"stage3.json.rank{rank}").read_text())["optimizer_state_elements"]
        assert 0.5 * whole < held < 0.75 * whole, (held, whole)


def stage3_argv(world, output_dir):
    """4 GRPO steps, a checkpoint every 2, and an evaluation of 9 prompts (5 on rank 0, 4 on rank 1) in batches
    of 4: rank 1 has one batch fewer to generate, while rank 0's forwards need its weights. Micro-batches of at
    most 24 tokens: the ranks' log-prob passes split their rows into different numbers of them."""
    return small_run_argv(
        world, str(output_dir), use_rm_server="false", use_rule_reward="true", max_steps=4, save_steps=2,
        eval_steps=2, max_eval_samples=9, per_device_eval_batch_size=4, max_token_len_per_device=24, **STAGE3, **STEP,
    )


@pytest.mark.slow
def test_sharding_stage3_run_with_evaluation_resumes_exactly(tiny_world, tmp_path):
    straight = tmp_path / "straight"
    log = launch_two_processes(RUN_PPO, [TINY_CONFIG, *stage3_argv(tiny_world, straight)], tmp_path / "log", script=STAGE3_ON_CPU)[0]
    metrics = step_metrics(log)
    assert len(metrics) == 4 and all(float(step["grad_norm"]) > 0 for step in metrics)
    assert "eval_accuracy" in (straight / "eval_results.json").read_text()
    # The optimizer's parts are keyed by the parameters' paths, as stage 1's are.
    state = optimizer_arrays(straight / "checkpoint-2" / "optimizer.shard01.pdopt")
    assert "slice@qwen2.layers.0.mlp.up_proj.weight_moment1_0" in state

    resumed = tmp_path / "resumed"
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    log = launch_two_processes(RUN_PPO, [TINY_CONFIG, *stage3_argv(tiny_world, resumed)], tmp_path / "resumed_log", script=STAGE3_ON_CPU)[0]
    assert_resumed_run_ends_as_uninterrupted(log, resumed, straight, metrics, ["shard00", "shard01"])
