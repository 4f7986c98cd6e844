"""Scale-out on CPU: parallel-degree validation, 2-process data-parallel and sharding-stage-1 GRPO steps
against a 1-process step on the same global batch, and sharded checkpoints that resume exactly. Tensor
parallel: tests/llm/alignment/ppo/test_tensor_parallel.py."""

import json
import os
import re
import shutil
import time
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM
from safetensors import safe_open

from helpers import FROZEN_RUN, REPO_ROOT, first_step, launch_two, launch_two_processes, numpy_gae, paddlenlp_messages, parse, small_run_argv
from paddle_alignment.config.layout import check_parallel_degrees

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
        {"tensor_parallel_degree": 2},  # x 4 data-parallel ranks
        {"tensor_parallel_degree": 4, "sharding": "stage1", "sharding_parallel_degree": 2},  # PaddleNLP's Qwen GRPO layout
        {"sharding": "stage1", "sharding_parallel_degree": 8},
        {"sharding": "stage1", "sharding_parallel_degree": 4},
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
    ],
)
def test_inconsistent_parallel_degrees_fail_naming_the_keys(changes, world, message):
    with pytest.raises(ValueError, match=message):
        check_parallel_degrees(layout(**changes), world_size=world, on_accelerator=True)


@pytest.mark.parametrize("stage, says", [("stage1", "(stage 1)"), ("stage2", "stages 2 and 3, which would also divide gradients")])
def test_sharding_with_tensor_parallel_says_what_each_sharding_rank_keeps(stage, says):
    with paddlenlp_messages() as lines:
        check_parallel_degrees(layout(tensor_parallel_degree=4, sharding=stage, sharding_parallel_degree=2), 8, True)
    kept = [line for line in lines if "each of the 2 sharding ranks steps and keeps the optimizer states of its share" in line]
    assert len(kept) == 1 and says in kept[0], lines


def test_sequence_parallel_and_one_rank_sharding_are_switched_off_with_a_log_line():
    for degree in (8, 1):
        args = layout(sequence_parallel=True, tensor_parallel_degree=degree)
        with paddlenlp_messages() as lines:
            check_parallel_degrees(args, world_size=degree, on_accelerator=True)
        assert args.sequence_parallel is False
        assert any(line.startswith("sequence_parallel=True has no effect") for line in lines), lines
    # PaddleNLP's rm config (sharding stage2) adapted to one CPU process: stage 2 over one rank does nothing.
    args = layout(sharding="stage2", sharding_parallel_degree=1)
    with paddlenlp_messages() as lines:
        check_parallel_degrees(args, world_size=1, on_accelerator=False)
    assert args.sharding == "" and any("over one rank has no effect" in line for line in lines), lines


def test_tensor_parallel_runs_on_cpu():
    check_parallel_degrees(layout(tensor_parallel_degree=2), world_size=2, on_accelerator=False)


def test_sharding_stage1_runs_on_cpu_and_stages_2_and_3_need_gpus():
    check_parallel_degrees(layout(sharding="stage1", sharding_parallel_degree=2), world_size=2, on_accelerator=False)
    for stage in ["stage2", "stage3"]:
        with pytest.raises(ValueError, match=f"sharding={stage}: stages 2 and 3 .* need GPUs; on CPU use sharding stage1"):
            check_parallel_degrees(layout(sharding=stage), world_size=2, on_accelerator=False)


def test_a_cpu_config_with_tensor_parallel_stops_at_parse(tmp_path):

    with pytest.raises(ValueError, match="tensor_parallel_degree=2 .* does not divide the 1 launched"):
        parse(tmp_path, tensor_parallel_degree=2)
    # One process: sharding (even stage 2) has no rank to shard over and is switched off.
    assert not parse(tmp_path, sharding="stage2")[2].sharding


@pytest.mark.slow
def test_two_process_grpo_step_equals_one_process_on_the_same_global_batch(tiny_world, tmp_path, one_process_first_step):
    """The first GRPO step's loss, gradient norm and rollout metrics: 2 ranks x 4 prompts (gradients averaged
    by data parallel) against 1 rank x 8 prompts. Rollouts are fixed (tests/probes/grpo_first_step.py).
    With token-mean every response token of the step weighs the same whichever rank holds it (verl's
    global token mean): the ranks hold different numbers of tokens, so a per-rank mean would differ."""
    one = one_process_first_step("grpo")
    two = first_step(tiny_world, tmp_path, "double", processes=2)
    rank_tokens = [json.loads((tmp_path / f"double.json.rank{rank}").read_text())["response_tokens"] for rank in (0, 1)]
    assert rank_tokens[0] != rank_tokens[1], rank_tokens  # so a mean of per-rank token means would differ
    assert one["grad_norm"] > 1e-3 and 0 < one["accuracy"] < 1  # a real gradient from mixed rewards
    for key in ["loss/policy_avg", "grad_norm", "reward_mean", "accuracy", "response_length_mean"]:
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    # The entropy statistic is a mean over each rank's tokens, then over ranks: ranks with fewer tokens
    # weigh a little more, so it agrees less closely.
    assert two["entropy"] == pytest.approx(one["entropy"], rel=1e-3)


@pytest.mark.slow
def test_four_processes_form_the_groups_of_hybrid_layouts(tmp_path):
    """Paddle's gloo groups meet through per-group stores (distributed.rendezvous_each_gloo_group_apart):
    under 4 processes, fleet's groups of TP4 and TP2 x DP2 made 3 times over, side by side and one after
    another, each all-reduce to its members' sum. Paddle's own setup failed this probe in 6 runs of 6."""
    output = tmp_path / "groups.json"
    launch_two_processes(str(output), [], tmp_path / "log", script=os.path.join(PROBES, "gloo_groups.py"), processes=4)
    result = json.loads(output.read_text())
    assert result["sums"] == [float(sum(rank + 1 for rank in ranks)) for ranks in result["groups"]]


@pytest.mark.slow
def test_advantages_are_whitened_over_every_data_parallel_rank(tmp_path):
    """REINFORCE++ and GAE whiten over the global batch, as verl does: each of 2 ranks' half equals the
    NumPy whitening (verl's masked_whiten, unbiased variance) of the whole batch."""

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


# ---- sharding stage 1 (fleet's DygraphShardingOptimizer) over 2 processes ------------------------------

SHARDING = {"sharding": "stage1", "sharding_parallel_degree": 2}


@pytest.mark.slow
def test_sharding_stage1_grpo_step_equals_one_process_on_the_same_global_batch(tiny_world, tmp_path, one_process_first_step):
    """Each sharding rank's optimizer updates half the parameters: gradients are reduced inside the
    optimizer step and the updated weights broadcast after it. Against 1 process on the same 8 prompts:
    the loss, the pre-clip gradient norm of the whole batch (not a rank's own), and the weights after the step."""
    one = one_process_first_step("grpo")
    two = first_step(tiny_world, tmp_path, "sharded", processes=2, **SHARDING)
    assert one["grad_norm"] > 1e-3 and 0 < one["accuracy"] < 1
    for key in ["loss/policy_avg", "grad_norm", "reward_mean", "accuracy"]:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    names = sorted(one["weights"])
    before = paddle.load(os.path.join(tiny_world["model"], "model_state.pdparams"))
    moved = [abs(np.abs(before[name].numpy().astype("float64")).sum() - one["weights"][name][1]) for name in names]
    # Every parameter moved, on whichever rank its optimizer part sits: an unmoved one gives the same float64
    # sum exactly, while a norm weight with a tiny gradient moves its sum by only a few 1e-6.
    assert min(moved) > 1e-9
    # (1e-6 relative, as every layout's step: the sums of absolute values of a step's weights differ by up to
    # 9.7e-7 relative between the two layouts' reduction orders, on the tiny world a worker of the suite builds)
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=1e-5)


def sharded_argv(world, output_dir, **changes):
    """The issue's command (`--sharding stage1 --sharding_parallel_degree 2 --per_device_prompt_batch_size 4
    --per_device_train_batch_size 32` on config/tiny/grpo_argument.json) on the test world: 4 steps, a
    checkpoint every 2, no evaluation."""
    return small_run_argv(
        world, str(output_dir), use_rm_server="false", use_rule_reward="true", rollout_n=None,
        per_device_train_batch_size=32, max_steps=4, save_steps=2, eval_datasets="", **{**SHARDING, **changes},
    )


def step_metrics(log):
    """The metrics each step logged (rank 0's worker log), without timings."""
    lines = [line for line in log.splitlines() if "grad_norm: " in line]
    timings = {"step_time", "eps", "rollout_tokens_per_s", "rollout_wait_s", "train_wait_s", "weight_move_seconds"}
    return [
        {key: value for key, value in (item.split(": ") for item in line.split(" - ", 1)[1].split(", ")) if key not in timings}
        for line in lines
    ]


@pytest.fixture(scope="module")
def sharded_run(tiny_world, tmp_path_factory):
    """An uninterrupted sharded run: (its output_dir, its rank-0 metrics per step)."""
    output_dir = tmp_path_factory.mktemp("sharded_run") / "out"
    logs = launch_two_processes(TINY_CONFIG, sharded_argv(tiny_world, output_dir), output_dir.parent / "log")
    return output_dir, step_metrics(logs[0])


def safetensors_arrays(path):
    with safe_open(str(path), framework="np") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


def optimizer_arrays(path):
    return {key: np.asarray(value) for key, value in paddle.load(str(path), return_numpy=True).items() if key != "LR_Scheduler"}


@pytest.mark.slow
def test_sharding_checkpoints_hold_every_ranks_optimizer_part(sharded_run):
    output_dir, _ = sharded_run
    checkpoint = output_dir / "checkpoint-2"
    assert sorted(n for n in os.listdir(checkpoint) if n.endswith(".pdopt")) == ["optimizer.shard00.pdopt", "optimizer.shard01.pdopt"]
    parts = [optimizer_arrays(checkpoint / f"optimizer.shard0{rank}.pdopt") for rank in (0, 1)]
    owners = [{key.split("_moment1_")[0] for key in part if "_moment1_" in key} for part in parts]
    assert owners[0] and owners[1] and not owners[0] & owners[1]  # each rank's own parameters
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint / "policy"))
    assert owners[0] | owners[1] == {name for name, _ in model.named_parameters()}  # together, every parameter


@pytest.mark.slow
def test_sharding_run_restarted_after_a_crash_ends_exactly_as_the_uninterrupted_run(tiny_world, sharded_run, tmp_path):
    """The uninterrupted run's checkpoint-2 alone, as a crash after it leaves the output_dir: rerunning the same
    command resumes from it (every rank its optimizer part and RNG state) and ends on the same metrics,
    weights and optimizer states, bit for bit."""
    output_dir, straight_metrics = sharded_run
    crashed = tmp_path / "out"
    os.makedirs(crashed)
    shutil.copytree(output_dir / "checkpoint-2", crashed / "checkpoint-2")
    logs = launch_two_processes(TINY_CONFIG, sharded_argv(tiny_world, crashed), tmp_path / "log")
    assert_resumed_run_ends_as_uninterrupted(logs[0], crashed, output_dir, straight_metrics, ["shard00", "shard01"])


@pytest.mark.slow
def test_a_stopped_peer_ends_the_run_naming_the_collective_and_the_rerun_resumes_exactly(tiny_world, sharded_run, tmp_path):
    """Rank 1 stops itself (SIGSTOP) after writing checkpoint-2 (tests/probes/frozen_run.py): rank 0's next
    collective fails at gloo's 30 s timeout on CPU, and the run stops naming the collective, the step and the
    last event; the same command resumes from checkpoint-2 and ends as the uninterrupted run, bit for bit."""
    output_dir, straight_metrics = sharded_run
    started = time.monotonic()
    code, output, logs = launch_two("rank-1:2", [TINY_CONFIG, *sharded_argv(tiny_world, tmp_path / "out")], tmp_path / "log", FROZEN_RUN)
    assert code != 0 and time.monotonic() - started < 150, output[-3000:]
    assert re.search(
        r"collective failed after 3\d s \(.*TIMEOUT.*\): .* over 2 ranks; after RL step 2; the last event before it: ",
        logs[0],
    ), logs[0][-3000:]
    logs = launch_two_processes(TINY_CONFIG, sharded_argv(tiny_world, tmp_path / "out"), tmp_path / "rerun_log")
    assert_resumed_run_ends_as_uninterrupted(logs[0], tmp_path / "out", output_dir, straight_metrics, ["shard00", "shard01"])


def assert_resumed_run_ends_as_uninterrupted(log, resumed_dir, straight_dir, straight_metrics, parts):
    """A run resumed from checkpoint-2 into `resumed_dir` (rank 0's worker `log`) against the uninterrupted run in
    `straight_dir`: steps 3-4 logged the same metrics, and the final policy and the optimizer files of the
    `parts` (optimizer.<part>.pdopt of checkpoint-4) are equal bit for bit."""
    assert f"resumed from {resumed_dir / 'checkpoint-2'} at step 2" in log
    assert step_metrics(log) == straight_metrics[2:]
    resumed, straight = (safetensors_arrays(out / "policy" / "model.safetensors") for out in (resumed_dir, straight_dir))
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    for part in parts:
        name = f"checkpoint-4/optimizer.{part}.pdopt"
        resumed_state, straight_state = optimizer_arrays(resumed_dir / name), optimizer_arrays(straight_dir / name)
        assert resumed_state.keys() == straight_state.keys()
        for key, value in straight_state.items():
            np.testing.assert_array_equal(resumed_state[key], value, err_msg=f"{name} {key}")


@pytest.mark.slow
def test_a_missing_sharding_rank_optimizer_file_stops_every_rank_naming_it(tiny_world, sharded_run, tmp_path):
    output_dir, _ = sharded_run
    shutil.copytree(output_dir / "checkpoint-2", tmp_path / "out" / "checkpoint-2")
    os.remove(tmp_path / "out" / "checkpoint-2" / "optimizer.shard01.pdopt")
    with pytest.raises(AssertionError) as failure:
        launch_two_processes(TINY_CONFIG, sharded_argv(tiny_world, tmp_path / "out"), tmp_path / "log")
    message = str(failure.value)
    assert "optimizer.shard01.pdopt is missing" in message
    assert "a checkpoint resumes at the layout it was saved with" in message.lower()


@pytest.mark.slow
def test_resuming_a_sharded_checkpoint_in_one_process_names_the_layout(tiny_world, sharded_run, tmp_path):
    from llm.alignment.ppo import run_ppo

    output_dir, _ = sharded_run
    shutil.copytree(output_dir / "checkpoint-2", tmp_path / "out" / "checkpoint-2")
    argv = sharded_argv(tiny_world, tmp_path / "out", sharding="", sharding_parallel_degree=-1)
    with pytest.raises(FileNotFoundError, match=re.escape(
        "optimizer.pdopt is missing. This run's parallel layout reads optimizer.pdopt; the checkpoint holds "
        "optimizer.shard00.pdopt, optimizer.shard01.pdopt. A checkpoint resumes at the layout it was saved with"
    )):
        run_ppo.main([TINY_CONFIG, *argv])
