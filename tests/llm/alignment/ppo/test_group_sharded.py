"""Sharding stages 2 and 3 (paddle's group_sharded_parallel, os_g and p_g_os) over 2 CPU processes, through
tests/probes/group_sharded_on_cpu.py (paddle's engine with its device checks passed; under stage 3 every weight
of the tiny model sliced): GRPO and PPO steps against one process on the same global batch, and runs with
uneven evaluation shards and checkpoints that resume exactly."""

import json
import os
import shutil

import numpy as np
import pytest

from helpers import FIRST_STEP_PROBE, REPO_ROOT, RUN_PPO, TINY_CONFIG, first_step, launch_two_processes, small_run_argv
from test_parallel import assert_resumed_run_ends_as_uninterrupted, optimizer_arrays, step_metrics

GROUP_SHARDED_ON_CPU = os.path.join(REPO_ROOT, "tests", "probes", "group_sharded_on_cpu.py")
# The steps' gradient norms are 0.24-1.8 (the LoRA policy's the smallest): the stage's global-norm clip scales
# the others. Weight decay checks that the parameters stage 3 steps as slices, under other names, still decay.
STEP = {"max_grad_norm": 0.3, "weight_decay": 0.1}


def sharding(stage):
    return {"sharding": stage, "sharding_parallel_degree": 2}


def group_sharded_first_step(world, tmp_path, stage, **changes):
    """helpers.first_step over 2 processes under sharding `stage` (the probe runs grpo_first_step.py)."""
    prompts = 4
    argv = small_run_argv(
        world, str(tmp_path / "sharded"), per_device_prompt_batch_size=prompts, per_device_train_batch_size=4 * prompts,
        use_rm_server="false", use_rule_reward="true", loss_agg_mode="token-mean", max_steps=1, **sharding(stage), **changes,
    )
    output = tmp_path / "sharded.json"
    launch_two_processes(FIRST_STEP_PROBE, [str(output), TINY_CONFIG, *argv], tmp_path / "sharded_log", script=GROUP_SHARDED_ON_CPU)
    return json.loads(output.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage, changes",
    [
        ("stage3", {"rl_algorithm": "grpo"}),
        ("stage3", {"rl_algorithm": "ppo"}),
        ("stage3", {"rl_algorithm": "grpo", "lora": "true", "lora_rank": 4, "recompute": "true"}),
        ("stage2", {"rl_algorithm": "ppo"}),
    ],
    ids=["stage3-grpo", "stage3-ppo", "stage3-grpo-lora-recompute", "stage2-ppo"],
)
def test_group_sharded_step_equals_one_process_on_the_same_global_batch(tiny_world, tmp_path, stage, changes):
    """Stage 2: each rank steps the parameters it owns, their gradients reduced to it in the backward, and
    broadcasts them after. Stage 3: each rank keeps slices of the weights; every forward gathers its layer's
    weights and every backward reduces their gradients to the slices. Against 1 process on the same 8 prompts:
    the loss, the gradient norms of the whole batch (measured inside the stage's step), the weights after it
    (clipped by the stage's own global-norm clip).
    PPO's critic is sharded too; with LoRA only the adapters train (and are sliced), the reference being the
    policy with them off."""
    one = first_step(tiny_world, tmp_path, "one", processes=1, **changes, **STEP)
    two = group_sharded_first_step(tiny_world, tmp_path, stage, **changes, **STEP)
    keys = ["loss/policy_avg", "grad_norm", "reward_mean", "accuracy"]
    keys += ["loss/value_avg", "critic_grad_norm"] if changes["rl_algorithm"] == "ppo" else []
    assert one["grad_norm"] > 1e-3
    for key in keys:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    names = sorted(one["weights"])
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=1e-5)
    # Each rank's optimizer holds the states of half the parameters (stage 2: those it owns) or of half of each
    # sliced one (stage 3; padded to its alignment) and all of the small ones stage 3 leaves whole (biases,
    # norms, LoRA's A matrices): 50.5% of the states of stage 3's GRPO step, 73% with LoRA.
    whole = json.loads((tmp_path / "one.json.rank0").read_text())["optimizer_state_elements"]
    held = [json.loads((tmp_path / f"sharded.json.rank{rank}").read_text())["optimizer_state_elements"] for rank in (0, 1)]
    assert all(0.3 * whole < part < 0.75 * whole for part in held), (held, whole)
    if stage == "stage2":
        assert sum(held) == whole


def sharded_argv(world, output_dir, stage):
    """4 GRPO steps, a checkpoint every 2, and an evaluation of 9 prompts (5 on rank 0, 4 on rank 1) in batches
    of 4: rank 1 has one batch fewer to generate, while under stage 3 rank 0's forwards need its weights.
    Micro-batches of at most 24 tokens: the ranks' log-prob passes split their rows into different numbers of
    them."""
    return small_run_argv(
        world, str(output_dir), use_rm_server="false", use_rule_reward="true", max_steps=4, save_steps=2,
        eval_steps=2, max_eval_samples=9, per_device_eval_batch_size=4, max_token_len_per_device=24, **sharding(stage), **STEP,
    )


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage2", "stage3"])
def test_group_sharded_run_with_evaluation_resumes_exactly(tiny_world, tmp_path, stage):
    straight = tmp_path / "straight"
    argv = [TINY_CONFIG, *sharded_argv(tiny_world, straight, stage)]
    log = launch_two_processes(RUN_PPO, argv, tmp_path / "log", script=GROUP_SHARDED_ON_CPU)[0]
    metrics = step_metrics(log)
    assert len(metrics) == 4 and all(float(step["grad_norm"]) > 0 for step in metrics)
    assert "eval_accuracy" in (straight / "eval_results.json").read_text()
    # The optimizer's parts are keyed by the parameters' paths, as stage 1's are (stage 3's slices prefixed).
    state = optimizer_arrays(straight / "checkpoint-2" / "optimizer.shard01.pdopt")
    assert state and all(key.removeprefix("slice@").startswith(("qwen2.", "lm_head.")) for key in state), sorted(state)
    if stage == "stage3":
        assert "slice@qwen2.layers.0.mlp.up_proj.weight_moment1_0" in state

    resumed = tmp_path / "resumed"
    os.makedirs(resumed)
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    argv = [TINY_CONFIG, *sharded_argv(tiny_world, resumed, stage)]
    log = launch_two_processes(RUN_PPO, argv, tmp_path / "resumed_log", script=GROUP_SHARDED_ON_CPU)[0]
    assert_resumed_run_ends_as_uninterrupted(log, resumed, straight, metrics, ["shard00", "shard01"])
