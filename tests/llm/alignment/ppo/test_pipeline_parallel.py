"""Pipeline parallel on CPU through fleet's own PipelineLayer and 1F1B schedule (pipeline_parallel.py bridges
its device calls to gloo), under `paddle.distributed.launch`: a PP2 GRPO and PPO step (policy and critic pipes)
equal one process's, and so do a PP2 x DP2 and a PP2 x TP2 step (fleet's tensor-parallel layers in the stages,
stage_tensor_parallel.py); a PP2 x TP2 run writes each stage's part of one loadable checkpoint, resumes from it
exactly, and saves whole final models. The tiny model's 2 layers make one per stage, its tied embedding and LM
head a weight the two stages share."""

import json
import os
import re
import shutil
import time

import numpy as np
import pytest
from paddlenlp.transformers import AutoModelForCausalLM

from helpers import FROZEN_RUN, REPO_ROOT, first_step, launch_two, launch_two_processes, overrides, train_log
from paddle_alignment.models.score_model import AutoModelForScore
from test_parallel import assert_resumed_run_ends_as_uninterrupted, optimizer_arrays, safetensors_arrays, step_metrics

TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")

pytestmark = pytest.mark.slow


def assert_step_equals(one, other, algorithm, data_parallel=False):
    """Losses, gradient norms and statistics of the step, and the weights after it (the tests of tensor
    parallel bound them the same way: Adam divides PPO's ~1e-8 first policy gradients by their own RMS).
    Under data parallel, statistics averaged over each data rank's tokens, then over the ranks, agree less
    closely (test_parallel.py)."""
    keys = ["loss/policy_avg", "grad_norm", "reward_mean"]
    keys += ["loss/value_avg", "critic_grad_norm"] if algorithm == "ppo" else []
    per_rank_means = ["entropy"] + (["val/value_mean"] if algorithm == "ppo" else [])
    assert one["grad_norm"] > 1e-3 and (algorithm == "grpo" or one["critic_grad_norm"] > 1e-3)
    for key in keys + ([] if data_parallel else per_rank_means):
        assert other[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for key in per_rank_means if data_parallel else []:
        assert other[key] == pytest.approx(one[key], rel=1e-3), key
    names = sorted(one["weights"])
    assert sorted(other["weights"]) == names  # the whole actor, which took the stages' weights after the update
    atol = 5e-5 if algorithm == "ppo" else 1e-5
    np.testing.assert_allclose([other["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=atol)


@pytest.mark.parametrize("algorithm, eval_mode", [("grpo", "single"), ("ppo", "tensor_parallel")])
def test_pipeline_parallel_step_equals_one_process(tiny_world, tmp_path, one_process_first_step, algorithm, eval_mode):
    """The first step on fixed rollouts (tests/probes/grpo_first_step.py): both stages hold the whole batch, the
    first stage the embedding and layer 0, the last layer 1, the norm and the (tied) head or the score head.
    The models that roll out and score are whole on each rank (eval_mode single), or split over both stages'
    ranks by the tensor-parallel plan (eval_mode tensor_parallel), each rank holding half of each split weight;
    the whole actor, gathered after the weight move, is one process's."""
    one = one_process_first_step(algorithm)
    two = first_step(tiny_world, tmp_path, "two", processes=2, data_ranks=1, rl_algorithm=algorithm, pipeline_parallel_degree=2,
                     eval_mode=eval_mode)
    assert_step_equals(one, two, algorithm)
    ranks = [json.loads((tmp_path / f"two.json.rank{rank}").read_text()) for rank in (0, 1)]
    whole = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    whole_elements = sum(p.size for p in whole.parameters())
    # Each stage trains (and keeps optimizer states for) its own part; the tied embedding sits on both.
    embedding = whole.qwen2.embed_tokens.weight.size
    stage_elements = [rank["parameter_elements"] for rank in ranks]
    assert sum(stage_elements) == whole_elements + embedding
    assert all(elements < whole_elements for elements in stage_elements)
    rollout_elements = [rank["rollout_parameter_elements"] for rank in ranks]
    if eval_mode == "single":
        assert rollout_elements == [whole_elements] * 2
    else:  # norms whole, and the tied embedding unsplit by the plan
        assert all(elements < 0.6 * whole_elements for elements in rollout_elements)


def test_pipeline_by_data_parallel_step_equals_one_process(tiny_world, tmp_path, one_process_first_step):
    """PP2 x DP2 on 4 processes: each data rank's two stages take half the prompts; PPO's policy and critic
    pipes average their gradients over the data ranks inside fleet's step."""
    one = one_process_first_step("ppo")
    four = first_step(tiny_world, tmp_path, "four", processes=4, data_ranks=2, rl_algorithm="ppo", pipeline_parallel_degree=2)
    rank_tokens = [json.loads((tmp_path / f"four.json.rank{rank}").read_text())["response_tokens"] for rank in range(4)]
    assert rank_tokens[0] == rank_tokens[1] != rank_tokens[2] == rank_tokens[3], rank_tokens  # a batch per stage pair
    assert_step_equals(one, four, "ppo", data_parallel=True)


def test_pipeline_by_tensor_parallel_step_equals_one_process(tiny_world, tmp_path, one_process_first_step):
    """PP2 x TP2 on 4 processes: each stage's layers split over two ranks with fleet's tensor-parallel layers
    (q/k/v, gate/up by columns, o/down by rows, the tied embedding and LM head over the vocabulary), all four
    ranks on the same batch; the whole actor gathers the blocks before taking the other stage's weights. PPO,
    so that the critic's pipe splits too (the policy's objective is GRPO's but for the advantages)."""
    one = one_process_first_step("ppo")
    four = first_step(tiny_world, tmp_path, "four", processes=4, data_ranks=1, rl_algorithm="ppo",
                      pipeline_parallel_degree=2, tensor_parallel_degree=2)
    assert_step_equals(one, four, "ppo")
    ranks = [json.loads((tmp_path / f"four.json.rank{rank}").read_text()) for rank in range(4)]
    whole = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    # Each rank trains a block of its stage: a quarter of the weights, more for what each stage keeps whole.
    assert all(rank["parameter_elements"] < sum(p.size for p in whole.parameters()) / 2 for rank in ranks)


def test_a_rollout_split_over_each_data_ranks_stages_steps_as_one_process(tiny_world, tmp_path, one_process_first_step):
    """eval_mode tensor_parallel at PP2 x DP2: each data rank's rollout models split over its two stages' ranks
    (fleet's check group), not over the data ranks."""
    one = one_process_first_step("ppo")
    four = first_step(tiny_world, tmp_path, "four", processes=4, data_ranks=2, rl_algorithm="ppo", pipeline_parallel_degree=2,
                      eval_mode="tensor_parallel")
    assert_step_equals(one, four, "ppo", data_parallel=True)


# The checkpointed run's layout: PP2 x TP2 on 4 processes, the files of each stage's tensor-parallel ranks.
PARTS = ["tp00_pp00", "tp00_pp01", "tp01_pp00", "tp01_pp01"]


def pipeline_argv(world, output_dir, **changes):
    return overrides(world, str(output_dir), **{"rl_algorithm": "ppo", "max_steps": 4, "save_steps": 2, "eval_steps": 2,
                                                "pipeline_parallel_degree": 2, "tensor_parallel_degree": 2, **changes})


def launch_four(argv, log_dir):
    return launch_two_processes(TINY_CONFIG, argv, log_dir, processes=4)


@pytest.fixture(scope="module")
def pipeline_run(tiny_world, tmp_path_factory):
    """An uninterrupted PP2 x TP2 PPO run of 4 steps, checkpoints at 2 and 4: (output_dir, rank 0's step metrics)."""
    root = tmp_path_factory.mktemp("pipeline_run")
    logs = launch_four(pipeline_argv(tiny_world, root / "out"), root / "log")
    return root / "out", step_metrics(logs[0])


def test_pipeline_checkpoints_hold_each_stages_part_and_load_whole(tiny_world, pipeline_run):
    """Each stage writes its weights, gathered from its tensor-parallel blocks, into one folder that loads whole
    in one process (paddlenlp's sharded safetensors with an index), beside each rank's own optimizer file
    (paddlenlp's tp/pp suffixes)."""
    output_dir, metrics = pipeline_run
    assert len(metrics) == 4 and all(float(m["grad_norm"]) > 0 and float(m["critic_grad_norm"]) > 0 for m in metrics)
    checkpoint = output_dir / "checkpoint-4"
    assert sorted(n for n in os.listdir(checkpoint) if n.endswith(".pdopt")) == [
        f"{name}.{part}.pdopt" for name in ("optimizer", "value_optimizer") for part in PARTS
    ]
    parts = {part: optimizer_arrays(checkpoint / f"optimizer.{part}.pdopt") for part in PARTS}
    assert all(parts.values()) and not set(parts["tp00_pp00"]) & set(parts["tp00_pp01"]) - {"master_weights"}  # each stage's own
    up = next(key for key in parts["tp00_pp01"] if "up_proj" in key and "moment1" in key)
    assert not np.array_equal(parts["tp00_pp01"][up], parts["tp01_pp01"][up])  # each rank's block of it
    policy_files = sorted(os.listdir(checkpoint / "policy"))
    assert "model-00001-of-00002.safetensors" in policy_files and "model-00002-of-00002.safetensors" in policy_files
    index = json.loads((checkpoint / "policy" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert "tensor_parallel_degree" not in json.loads((checkpoint / "policy" / "config.json").read_text())
    # The last checkpoint and the final models (written from the whole models after the last update) agree.
    final = AutoModelForCausalLM.from_pretrained(str(output_dir / "policy"))
    from_stages = AutoModelForCausalLM.from_pretrained(str(checkpoint / "policy"))
    for (name, value), (_, other) in zip(final.state_dict().items(), from_stages.state_dict().items()):
        np.testing.assert_array_equal(value.numpy(), other.numpy(), err_msg=name)
    trained_from = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    assert not np.array_equal(final.qwen2.layers[1].mlp.up_proj.weight.numpy(), trained_from.qwen2.layers[1].mlp.up_proj.weight.numpy())
    critic = AutoModelForScore.from_pretrained(str(checkpoint / "value"))
    final_critic = AutoModelForScore.from_pretrained(str(output_dir / "value"))
    np.testing.assert_array_equal(critic.score_head.weight.numpy(), final_critic.score_head.weight.numpy())
    np.testing.assert_array_equal(critic.qwen2.layers[0].self_attn.q_proj.weight.numpy(), final_critic.qwen2.layers[0].self_attn.q_proj.weight.numpy())


def test_a_killed_pipeline_by_tensor_parallel_run_resumes_from_its_checkpoint_exactly(tiny_world, pipeline_run, tmp_path):
    """Rank 3 (the last stage's second tensor-parallel rank) ends itself with SIGKILL once checkpoint-2 is written
    (tests/probes/frozen_run.py): the launch ends within two minutes naming it. Rerunning the command resumes
    checkpoint-2: steps 3-4 log the same metrics, and the final policy and critic and every rank's optimizer
    states at step 4 are equal bit for bit."""
    output_dir, metrics = pipeline_run
    argv = pipeline_argv(tiny_world, tmp_path / "out")
    started = time.monotonic()
    code, output, _ = launch_two("kill-rank-3:2", [TINY_CONFIG, *argv], tmp_path / "killed_log", script=FROZEN_RUN, processes=4)
    assert code != 0 and time.monotonic() - started < 120, output[-3000:]
    assert re.search(r"Container rank 3 status failed .* code -9", output), output[-3000:]
    assert not (tmp_path / "out" / "checkpoint-4").exists()
    logs = launch_four(argv, tmp_path / "log")
    assert_resumed_run_ends_as_uninterrupted(logs[0], tmp_path / "out", output_dir, metrics, parts=PARTS)
    for part in PARTS:
        name = f"checkpoint-4/value_optimizer.{part}.pdopt"
        resumed, straight = optimizer_arrays(tmp_path / "out" / name), optimizer_arrays(output_dir / name)
        for key, value in straight.items():
            np.testing.assert_array_equal(resumed[key], value, err_msg=f"{name} {key}")
    resumed_critic, critic = (safetensors_arrays(out / "value" / "model.safetensors") for out in (tmp_path / "out", output_dir))
    for name, value in critic.items():
        np.testing.assert_array_equal(resumed_critic[name], value, err_msg=name)


def test_a_pipeline_checkpoint_resumes_in_one_process_only_without_its_optimizer_states(tiny_world, pipeline_run, tmp_path):
    """Its weights load at any layout; its optimizer files are per stage, so another layout stops naming both
    layouts' files, and with ignore_load_lr_and_optim the run goes on from the weights with fresh moments."""
    from llm.alignment.ppo import run_ppo

    output_dir, _ = pipeline_run
    shutil.copytree(output_dir / "checkpoint-2", tmp_path / "out" / "checkpoint-2")
    argv = pipeline_argv(tiny_world, tmp_path / "out", pipeline_parallel_degree=1, tensor_parallel_degree=1)
    with pytest.raises(FileNotFoundError, match=re.escape(
        "This run's parallel layout reads optimizer.pdopt, value_optimizer.pdopt; the checkpoint holds "
        + ", ".join(f"{name}.{part}.pdopt" for name in ("optimizer", "value_optimizer") for part in PARTS) + ". A "
        "checkpoint resumes at the layout it was saved with"
    )):
        run_ppo.main([TINY_CONFIG, *argv])
    run_ppo.main([TINY_CONFIG, *argv, "--ignore_load_lr_and_optim", "true"])
    assert len(train_log(tmp_path / "out", "grad_norm")) == 2  # steps 3 and 4
    assert os.path.isdir(tmp_path / "out" / "policy")
