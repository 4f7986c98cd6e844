"""Tensor parallel on CPU (Paddle's auto-parallel plan, models/tensor_parallel.py) under
`paddle.distributed.launch`: over 2 processes, a TP2 GRPO step and PPO step (policy and critic) equal one
process; TP2 rollouts of the fast decode loop equal TP1 token for token, with the vocabulary whole on every
rank (the tiny model's tied 259-token head) and split over the ranks (an untied copy padded to 260); a TP2
run saves whole models and per-rank optimizer slices, and resumes from them exactly. Over 4 processes, the
same at TP2 x DP2; over 8, PaddleNLP's TP4 x sharding-2 layout."""

import json
import os
import shutil

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoConfig, AutoModelForCausalLM

from paddle_alignment.models.hf_layout import safetensors_files, save_hf_weights, weight_files
from paddle_alignment.models.score_model import AutoModelForScore

from helpers import REPO_ROOT, RUN_FINETUNE, SFT_CONFIG, first_step, launch_two_processes, run_probe, small_run_argv, train_reward_model
from test_parallel import assert_resumed_run_ends_as_uninterrupted, optimizer_arrays, safetensors_arrays, step_metrics

PROBES = os.path.join(REPO_ROOT, "tests", "probes")
TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")

pytestmark = pytest.mark.slow


def split_messages(log_dir):
    """The tensor-parallel plan's log lines in rank 0's worker log (without their colour codes)."""
    log = (log_dir / "workerlog.0").read_text(errors="replace")
    return [line[line.index("- ") + 2 :].replace("\x1b[0m", "") for line in log.splitlines() if "tensor-parallel ranks" in line]


# PPO's models: the actor, the reference of its KL penalty (kl_coeff 0.02, PaddleNLP's default), the critic.
@pytest.mark.parametrize(
    "algorithm, models",
    [("grpo", ["Qwen2ForCausalLM"]), ("ppo", ["Qwen2ForCausalLM", "Qwen2ForCausalLM", "Qwen2ForScore"])],
)
def test_tensor_parallel_step_equals_one_process(tiny_world, tmp_path, one_process_first_step, algorithm, models):
    """The first step on fixed rollouts (tests/probes/grpo_first_step.py): both ranks of the TP group hold the
    whole batch and half of each split layer; the losses and gradient norms (policy, and critic for PPO)
    equal one process's."""
    one = one_process_first_step(algorithm)
    two = first_step(tiny_world, tmp_path, "two", processes=2, data_ranks=1, rl_algorithm=algorithm, tensor_parallel_degree=2)
    assert [m.split()[0] for m in split_messages(tmp_path / "two_log")] == models  # the models are split, not copies
    keys = ["loss/policy_avg", "grad_norm", "entropy", "reward_mean"]
    keys += ["loss/value_avg", "critic_grad_norm", "val/value_mean"] if algorithm == "ppo" else []
    assert one["grad_norm"] > 1e-3 and (algorithm == "grpo" or one["critic_grad_norm"] > 1e-3)
    for key in keys:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    # The weights after the AdamW step. PPO's first policy loss is ~1e-8 (whitened advantages at the old
    # policy), and Adam divides such gradients by their own RMS, so the split reductions' rounding shows more.
    names = sorted(one["weights"])
    atol = 5e-5 if algorithm == "ppo" else 1e-5
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=atol)


@pytest.mark.parametrize("vocabulary", ["whole", "split"])
def test_tensor_parallel_step_with_log_probs_in_chunks_equals_one_process(tiny_world, tmp_path, vocabulary):
    """Under tensor parallel too the response tokens' log-probs and entropies are taken from the hidden states a
    chunk of tokens at a time (models/head_logprobs.py), the LM head whole on every rank or split over the
    vocabulary (an untied, padded copy): in chunks of 8 tokens (micro-batches hold more), at temperature 0.7,
    the first GRPO step's loss, gradient norm, entropy and weights equal one process's taking each
    micro-batch's logits whole."""
    model = tiny_world["model"]
    if vocabulary == "split":
        model = untied_copy_with_padded_vocabulary(model, str(tmp_path / "untied"), 2)
    one = first_step(tiny_world, tmp_path, "one", processes=1, actor_model_name_or_path=model, temperature=0.7)
    two = first_step(tiny_world, tmp_path, "two", processes=2, data_ranks=1, actor_model_name_or_path=model,
                     temperature=0.7, tensor_parallel_degree=2, logprob_chunk_tokens=8)
    assert json.loads((tmp_path / "one.json.rank0").read_text())["chunked_head_passes"] == 0
    assert split_messages(tmp_path / "two_log")[0].endswith(f"vocabulary {'split' if vocabulary == 'split' else 'whole on every rank'}")
    ranks = [json.loads((tmp_path / f"two.json.rank{rank}").read_text()) for rank in range(2)]
    assert all(rank["chunked_head_passes"] > 0 for rank in ranks)
    for key in ["loss/policy_avg", "grad_norm", "entropy", "reward_mean"]:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    names = sorted(one["weights"])
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_tensor_parallel_by_data_parallel_step_equals_one_process(tiny_world, tmp_path, one_process_first_step, algorithm):
    """TP2 x DP2 over 4 processes: each tensor-parallel pair holds half of the 8 prompts and half of each split
    layer, and averages its gradient parts with the other pair. The first step's losses, gradient norms and
    weights after the step equal one process's on the same 8 prompts (for PPO the critic's too)."""
    one = one_process_first_step(algorithm)
    four = first_step(tiny_world, tmp_path, "four", processes=4, data_ranks=2, rl_algorithm=algorithm, tensor_parallel_degree=2)
    rank_tokens = [json.loads((tmp_path / f"four.json.rank{rank}").read_text())["response_tokens"] for rank in range(4)]
    assert rank_tokens[0] == rank_tokens[1] != rank_tokens[2] == rank_tokens[3], rank_tokens  # a batch per pair
    keys = ["loss/policy_avg", "grad_norm", "reward_mean"]
    keys += ["loss/value_avg", "critic_grad_norm"] if algorithm == "ppo" else []
    assert one["grad_norm"] > 1e-3 and (algorithm == "grpo" or one["critic_grad_norm"] > 1e-3)
    for key in keys:
        assert four[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    # Statistics averaged over each data rank's tokens, then over the ranks, agree less closely (as under
    # data parallel alone: test_parallel.py).
    for key in ["entropy"] + (["val/value_mean"] if algorithm == "ppo" else []):
        assert four[key] == pytest.approx(one[key], rel=1e-3), key
    names = sorted(one["weights"])
    atol = 5e-5 if algorithm == "ppo" else 1e-5  # as test_tensor_parallel_step_equals_one_process says
    np.testing.assert_allclose([four["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=atol)


def test_paddlenlp_qwen_layout_tensor_parallel_4_by_sharding_2_equals_one_process(tiny_world, tmp_path):
    """PaddleNLP's Qwen GRPO layout, TP4 x sharding stage 1 over 2, on 8 processes: a random model of the tiny
    world's shape with 4 key-value heads (so that 4 divides them). Two steps on the same 8 prompts a step as one
    process: the second step's loss and gradient norm, and the final policy written whole (policy/), equal one
    process's; the two sharding ranks of each tensor-parallel part hold AdamW's states (two moments and two
    step powers per parameter) of half its parameters each."""
    config = AutoConfig.from_pretrained(tiny_world["model"])
    config.num_key_value_heads = config.num_attention_heads
    model_dir = str(tmp_path / "four_kv_heads")
    paddle.seed(3)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    copy_tokenizer_files(tiny_world["model"], model_dir)
    one = first_step(tiny_world, tmp_path, "one", processes=1, actor_model_name_or_path=model_dir, max_steps=2)
    eight = first_step(tiny_world, tmp_path, "eight", processes=8, data_ranks=2, actor_model_name_or_path=model_dir,
                       tensor_parallel_degree=4, sharding="stage1", sharding_parallel_degree=2, max_steps=2)
    assert split_messages(tmp_path / "eight_log") == ["Qwen2ForCausalLM split over 4 tensor-parallel ranks: 14 layers, vocabulary whole on every rank"]
    assert "each of the 2 sharding ranks steps and keeps the optimizer states" in (tmp_path / "eight_log" / "workerlog.0").read_text()
    assert one["grad_norm"] > 1e-3
    for key in ["loss/policy_avg", "grad_norm", "reward_mean"]:
        assert eight[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    merged, alone = (safetensors_arrays(tmp_path / run / "policy" / "model.safetensors") for run in ("eight", "one"))
    assert merged.keys() == alone.keys()
    # (AdamW moves a weight whose gradient is mostly rounding by a share of the learning rate, 2e-4, either way:
    # a few such weights differ by a few 1e-6 after two steps.)
    for name, value in alone.items():
        np.testing.assert_allclose(merged[name], value, rtol=1e-6, atol=1e-5, err_msg=name)
    ranks = [json.loads((tmp_path / f"eight.json.rank{rank}").read_text()) for rank in range(8)]
    for part in range(4):
        pair = [rank for rank in ranks if rank["tensor_parallel_rank"] == part]
        whole_states = 2 * pair[0]["parameter_elements"] + 2 * pair[0]["parameters"]
        assert len(pair) == 2 and sum(rank["optimizer_state_elements"] for rank in pair) == whole_states
        assert all(rank["optimizer_state_elements"] < 0.55 * whole_states for rank in pair), pair


# run_reward at TP2 x DP2: 4 steps of 64 pairs (each tensor-parallel pair trains on its half), paddlenlp's
# checkpoints every 2 steps, evaluation at the end.
REWARD_CHANGES = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "eval_steps": 4, "logging_steps": 1,
                  "per_device_train_batch_size": 32}


@pytest.fixture(scope="module")
def reward_tensor_parallel_run(tiny_world, tmp_path_factory):
    """The TP2 x DP2 reward-model run (4 processes): (its folder, its eval metrics)."""
    folder = tmp_path_factory.mktemp("reward_tensor_parallel") / "straight"
    return folder, train_reward_model(tiny_world, str(folder), processes=4, tensor_parallel_degree=2, **REWARD_CHANGES)


def test_reward_model_training_at_tensor_parallel_by_data_parallel_equals_data_parallel(tiny_world, tmp_path, reward_tensor_parallel_run):
    """Against plain data parallel over 2 processes on the same batches: the same eval metrics, and the saved
    score model (written whole, as safetensors) equal weight for weight. (One process is not the reference:
    paddlenlp's Trainer shuffles a single process's batches with another sampler.)"""
    folder, four = reward_tensor_parallel_run
    two = train_reward_model(tiny_world, str(tmp_path / "two"), processes=2, **REWARD_CHANGES)
    assert "Qwen2ForScore split over 2 tensor-parallel ranks" in (folder / "log" / "workerlog.0").read_text()
    for key in ("eval_accuracy", "eval_loss"):
        assert four[key] == pytest.approx(two[key], rel=1e-5, abs=1e-6), key
    # The mean score follows the score head's bias, which is noise (below): it agrees to a small part of the
    # scores' spread, not to 1e-5 of itself (on an AVX-512 Xeon: 1.3e-6 apart, 1.4e-4 of the spread).
    assert four["eval_reward_mean"] == pytest.approx(two["eval_reward_mean"], abs=1e-3 * two["eval_reward_std"])
    trained = {run: dict(AutoModelForScore.from_pretrained(str(path)).named_parameters()) for run, path in (("two", tmp_path / "two"), ("four", folder))}
    start = dict(AutoModelForScore.from_pretrained(tiny_world["model"], score_type="reward").named_parameters())
    name = "qwen2.layers.0.self_attn.q_proj.weight"
    assert not np.allclose(trained["two"][name].numpy(), start[name].numpy())  # the steps moved the weights
    assert trained["four"].keys() == trained["two"].keys()
    # Adam moves each weight by up to the learning rate (1e-3) a step whatever its gradient's size: where a
    # gradient is near 0, the split reductions' rounding can turn its sign. So nearly every weight agrees to
    # 1e-6, and the rest within the 4 steps' reach. Two kinds of bias have gradients that are 0 but for
    # rounding: a key bias shifts all of a query's logits alike, and the score head's bias all scores alike,
    # where the loss sees only differences of scores. They are all noise, and only bounded.
    noise = ("k_proj.bias", "score_head.bias")
    for name, parameter in trained["two"].items():
        difference = np.abs(trained["four"][name].numpy() - parameter.numpy())
        assert difference.max() < 4 * 2e-3, name
        assert name.endswith(noise) or (difference > 1e-6).mean() < 1e-3, name


def test_reward_model_training_at_tensor_parallel_by_data_parallel_resumes_its_checkpoint_exactly(tiny_world, tmp_path, reward_tensor_parallel_run):
    """The checkpoints hold the score model written whole and each tensor-parallel rank's parts of the optimizer
    states in its file: with only checkpoint-2 left, as after a crash, the resumed run writes the uninterrupted
    run's final model and last optimizer files, bit for bit, each rank having read only its parts of the
    checkpoint's model."""
    straight, _ = reward_tensor_parallel_run
    crashed = tmp_path / "crashed"
    assert sorted(path.name for path in (straight / "checkpoint-4").glob("optimizer*")) == ["optimizer.tp00.pdopt", "optimizer.tp01.pdopt"]
    shutil.copytree(straight / "checkpoint-2", crashed / "checkpoint-2")
    train_reward_model(tiny_world, str(crashed), processes=4, tensor_parallel_degree=2, resume_from_checkpoint=crashed / "checkpoint-2", **REWARD_CHANGES)
    assert f"Qwen2ForScore resumed from {crashed / 'checkpoint-2'}: this rank read only its part" in (crashed / "log" / "workerlog.0").read_text()
    resumed, uninterrupted = (safetensors_arrays(run / "model.safetensors") for run in (crashed, straight))
    assert resumed.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    for part in ("tp00", "tp01"):
        name = f"checkpoint-4/optimizer.{part}.pdopt"
        resumed_state, straight_state = optimizer_arrays(crashed / name), optimizer_arrays(straight / name)
        assert resumed_state.keys() == straight_state.keys()
        for key, value in straight_state.items():
            np.testing.assert_array_equal(resumed_state[key], value, err_msg=f"{name} {key}")


def test_fine_tuning_at_tensor_parallel_by_data_parallel_equals_data_parallel(tiny_world, tmp_path):
    """run_finetune at TP2 x DP2 against plain data parallel over 2 processes on the same batches, 3 steps from
    the random model: the saved models (the split one written whole) give the same logits."""
    values = {
        "model_name_or_path": tiny_world["random_model"], "dataset_name_or_path": os.path.dirname(tiny_world["sft_train"]),
        "max_steps": 3, "per_device_train_batch_size": 32, "logging_steps": 1,
    }
    for run, extra in (("two", {}), ("four", {"tensor_parallel_degree": 2})):
        changes = {**values, **extra, "output_dir": tmp_path / run, "logging_dir": tmp_path / run / "vdl"}
        argv = [token for key, value in changes.items() for token in (f"--{key}", str(value))]
        launch_two_processes(SFT_CONFIG, argv, tmp_path / run / "log", script=RUN_FINETUNE, processes=4 if extra else 2)
    assert "Qwen2ForCausalLM split over 2 tensor-parallel ranks" in (tmp_path / "four" / "log" / "workerlog.0").read_text()
    tokens = paddle.to_tensor([[5, 17, 23, 9, 40, 2, 11, 30]], dtype="int64")
    logits = {}
    for run in ("two", "four", None):
        model = AutoModelForCausalLM.from_pretrained(str(tmp_path / run) if run else tiny_world["random_model"])
        model.eval()
        logits[run] = model(input_ids=tokens, return_dict=True).logits.numpy()
    assert np.abs(logits["two"] - logits[None]).max() > 1e-2  # 3 steps changed the model
    np.testing.assert_allclose(logits["four"], logits["two"], rtol=1e-4, atol=1e-4)


def copy_tokenizer_files(source, target):
    for name in os.listdir(source):
        if name.endswith((".json", ".txt")) and not os.path.exists(os.path.join(target, name)):
            shutil.copy(os.path.join(source, name), target)


def untied_copy_with_padded_vocabulary(source, target, multiple):
    """`source` with its tied LM head untied and the vocabulary padded with zero rows to a multiple of
    `multiple` (as Qwen pads its vocabulary), so the tensor-parallel plan splits both over the vocabulary."""
    model = AutoModelForCausalLM.from_pretrained(source)
    state = model.state_dict()
    table = state["qwen2.embed_tokens.weight"]
    padded = -(-table.shape[0] // multiple) * multiple
    table = paddle.concat([table, paddle.zeros([padded - table.shape[0], table.shape[1]], table.dtype)])
    config = AutoConfig.from_pretrained(source)
    config.vocab_size, config.tie_word_embeddings = padded, False
    untied = AutoModelForCausalLM.from_config(config)
    untied.set_state_dict({**state, "qwen2.embed_tokens.weight": table, "lm_head.weight": table.T})
    untied.save_pretrained(target)
    copy_tokenizer_files(source, target)
    return target


@pytest.mark.parametrize("vocabulary", ["whole", "split"])
def test_tensor_parallel_rollout_equals_one_process(tiny_world, tmp_path, vocabulary):
    """The fast decode loop on each rank's half of the weights (an all-reduce after the row-parallel products,
    the vocab-parallel logits gathered) samples the same tokens as one process, greedy and at temperature 1,
    and never falls back to generate()."""
    model = tiny_world["model"]
    if vocabulary == "split":
        model = untied_copy_with_padded_vocabulary(model, str(tmp_path / "untied"), 2)
    argv = [TINY_CONFIG, *small_run_argv(tiny_world, str(tmp_path / "run"), actor_model_name_or_path=model, use_rm_server="false", use_rule_reward="true")]
    probe = os.path.join(PROBES, "tp_rollout.py")
    one = run_probe(probe, tmp_path / "one.json", argv, None, processes=1)
    two = run_probe(probe, tmp_path / "two.json", [*argv, "--tensor_parallel_degree", "2"], tmp_path / "log", processes=2)
    assert split_messages(tmp_path / "log") == [f"Qwen2ForCausalLM split over 2 tensor-parallel ranks: {14 + 2 * (vocabulary == 'split')} layers, "
                                    f"vocabulary {'split' if vocabulary == 'split' else 'whole on every rank'}"]
    assert two["tensor_parallel"] and not one["tensor_parallel"]
    assert one["warnings"] == [] and two["warnings"] == []  # no fallback to generate()
    assert len({tuple(tokens) for tokens in one["sampled"]}) > 8  # varied samples, not one answer
    assert two["greedy"] == one["greedy"] and two["sampled"] == one["sampled"]


def test_tensor_parallel_by_data_parallel_greedy_rollout_equals_one_process(tiny_world, tmp_path):
    """TP2 x DP2: each tensor-parallel pair decodes its data rank's half of the prompts on its halves of the
    weights; the greedy responses equal one process's for the same prompts (sampled ones draw per batch)."""
    argv = [TINY_CONFIG, *small_run_argv(tiny_world, str(tmp_path / "run"), use_rm_server="false", use_rule_reward="true")]
    probe = os.path.join(PROBES, "tp_rollout.py")
    one = run_probe(probe, tmp_path / "one.json", argv, None, processes=1)
    run_probe(probe, tmp_path / "four.json", [*argv, "--tensor_parallel_degree", "2"], tmp_path / "log", processes=4)
    ranks = [json.loads((tmp_path / f"four.json.rank{rank}").read_text()) for rank in range(4)]
    assert all(rank["tensor_parallel"] and rank["warnings"] == [] for rank in ranks)
    assert ranks[0]["indices"] == ranks[1]["indices"] == list(range(0, 16, 2))  # a pair shares its prompts
    assert ranks[2]["indices"] == ranks[3]["indices"] == list(range(1, 16, 2))
    assert ranks[0]["greedy"] == ranks[1]["greedy"] and ranks[2]["greedy"] == ranks[3]["greedy"]
    greedy = {index: tokens for rank in (ranks[0], ranks[2]) for index, tokens in zip(rank["indices"], rank["greedy"])}
    assert len({tuple(tokens) for tokens in one["greedy"]}) > 1  # not one answer to every prompt
    assert [greedy[index] for index in range(16)] == one["greedy"]


def tensor_parallel_argv(world, output_dir, **changes):
    """The issue's command with `--tensor_parallel_degree 2` (config/tiny/grpo_argument.json, 4 prompts and 32
    completions per micro-batch) on the test world: 4 steps, a checkpoint every 2, no evaluation."""
    return small_run_argv(
        world, str(output_dir), use_rm_server="false", use_rule_reward="true", rollout_n=None, per_device_train_batch_size=32,
        max_steps=4, save_steps=2, eval_datasets="", tensor_parallel_degree=2, **changes,
    )


@pytest.fixture(scope="module")
def tensor_parallel_run(tiny_world, tmp_path_factory):
    """An uninterrupted TP2 run: (its output_dir, its rank-0 metrics per step, its worker logs)."""
    output_dir = tmp_path_factory.mktemp("tensor_parallel_run") / "out"
    logs = launch_two_processes(TINY_CONFIG, tensor_parallel_argv(tiny_world, output_dir), output_dir.parent / "log")
    return output_dir, step_metrics(logs[0]), logs


def test_tensor_parallel_run_uses_the_fast_decode_loop_and_saves_whole_models(tiny_world, tensor_parallel_run):
    """policy/ (final and in each checkpoint) is the whole model, loadable in one process with every
    parameter at its full shape; each rank saved its own slices of the AdamW moments."""
    output_dir, _, logs = tensor_parallel_run
    assert "fast rollout unavailable" not in logs[0] + logs[1]
    full = dict(AutoModelForCausalLM.from_pretrained(tiny_world["model"]).named_parameters())
    for folder in (output_dir / "policy", output_dir / "checkpoint-2" / "policy"):
        saved = dict(AutoModelForCausalLM.from_pretrained(str(folder)).named_parameters())
        assert {name: p.shape for name, p in saved.items()} == {name: p.shape for name, p in full.items()}
    checkpoint = output_dir / "checkpoint-2"
    assert sorted(n for n in os.listdir(checkpoint) if n.endswith(".pdopt")) == ["optimizer.tp00.pdopt", "optimizer.tp01.pdopt"]
    parts = [optimizer_arrays(checkpoint / f"optimizer.tp0{rank}.pdopt") for rank in (0, 1)]
    key = next(k for k in parts[0] if k.startswith("qwen2.layers.0.self_attn.q_proj.weight") and "moment1" in k)
    hidden = full["qwen2.layers.0.self_attn.q_proj.weight"].shape
    assert [list(part[key].shape) for part in parts] == [[hidden[0], hidden[1] // 2]] * 2  # column halves
    assert not np.array_equal(parts[0][key], parts[1][key])


def test_tensor_parallel_run_restarted_after_a_crash_ends_exactly_as_the_uninterrupted_run(tiny_world, tensor_parallel_run, tmp_path):
    """Only the uninterrupted run's checkpoint-2 left, as after a crash: the same command resumes from it (each
    rank reading its slices of the checkpoint's policy) and ends on the same metrics, weights and optimizer
    slices, bit for bit."""
    output_dir, straight_metrics, _ = tensor_parallel_run
    crashed = tmp_path / "out"
    shutil.copytree(output_dir / "checkpoint-2", crashed / "checkpoint-2")
    logs = launch_two_processes(TINY_CONFIG, tensor_parallel_argv(tiny_world, crashed), tmp_path / "log")
    assert_resumed_run_ends_as_uninterrupted(logs[0], crashed, output_dir, straight_metrics, ["tp00", "tp01"])
    # The checkpoint's policy is safetensors: each rank read only its part of it (split_loading.py).
    assert f"loaded from {crashed / 'checkpoint-2' / 'policy'}: this rank read only its part" in logs[0]


@pytest.mark.parametrize("data_axis, parts", [
    ({}, ["tp00", "tp01"]),
    ({"sharding": "stage1", "sharding_parallel_degree": 2}, ["tp00_shard00", "tp01_shard00", "tp00_shard01", "tp01_shard01"]),
], ids=["data_parallel", "sharding"])
def test_tensor_parallel_by_data_parallel_run_resumes_exactly_and_saves_whole_models(tiny_world, tmp_path, data_axis, parts):
    """TP2 x DP2, and TP2 x sharding stage 1 over 2, over 4 processes, 4 steps: policy/ is the whole model,
    loadable in one process; with only checkpoint-2 left, as after a crash, the same command ends on the
    uninterrupted run's metrics, weights and optimizer files bit for bit (one per tensor-parallel rank, or
    under sharding one per rank, each with its own share of its part's states)."""
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    argv = {run: tensor_parallel_argv(tiny_world, run, **data_axis) for run in (straight, crashed)}
    logs = launch_two_processes(TINY_CONFIG, argv[straight], tmp_path / "log", processes=4)
    full = dict(AutoModelForCausalLM.from_pretrained(tiny_world["model"]).named_parameters())
    saved = dict(AutoModelForCausalLM.from_pretrained(str(straight / "policy")).named_parameters())
    assert {name: p.shape for name, p in saved.items()} == {name: p.shape for name, p in full.items()}
    assert sorted(path.name for path in (straight / "checkpoint-4").glob("optimizer*")) == sorted(f"optimizer.{part}.pdopt" for part in parts)
    if data_axis:  # each sharding rank's file holds the states of its own share of its part's parameters
        for tensor_parallel_rank in ("tp00", "tp01"):
            shares = [set(optimizer_arrays(straight / "checkpoint-4" / f"optimizer.{tensor_parallel_rank}_shard0{rank}.pdopt")) for rank in (0, 1)]
            assert all(shares) and not shares[0] & shares[1], shares
    shutil.copytree(straight / "checkpoint-2", crashed / "checkpoint-2")
    resumed_logs = launch_two_processes(TINY_CONFIG, argv[crashed], tmp_path / "log_resumed", processes=4)
    assert_resumed_run_ends_as_uninterrupted(resumed_logs[0], crashed, straight, step_metrics(logs[0]), parts)


def safetensors_copies(source, tmp_path):
    """{label: folder} of `source`'s model written as safetensors: Hugging Face's layout in float32 (in shards,
    with an index) and in bfloat16, and paddlenlp's own layout."""
    model = AutoModelForCausalLM.from_pretrained(source)
    folders = {label: str(tmp_path / label) for label in ("hf_shards", "hf_bfloat16", "paddlenlp")}
    save_hf_weights(model, folders["hf_shards"], shard_bytes=200_000)
    save_hf_weights(model, folders["hf_bfloat16"], state={k: v.astype("bfloat16") for k, v in model.state_dict().items()})
    model.save_pretrained(folders["paddlenlp"], safe_serialization=True)
    assert len(weight_files(folders["hf_shards"])) > 1 and safetensors_files(folders["paddlenlp"])[1] is False
    return folders


def test_each_rank_reads_only_its_part_of_a_safetensors_checkpoint(tiny_world, tmp_path):
    """At TP2 the actor and critic built lazily from safetensors, each rank reading its slices
    (models/split_loading.py), hold exactly what loading the whole folder and splitting it gives, in both
    folder layouts and from bfloat16 files, with the vocabulary split (an untied, padded copy) and whole (the
    tiny model's tied head); the critic's fresh score head is the same on both ranks."""
    untied = untied_copy_with_padded_vocabulary(tiny_world["model"], str(tmp_path / "untied"), 2)
    folders = safetensors_copies(untied, tmp_path)
    folders["hf_tied"] = str(tmp_path / "hf_tied")
    save_hf_weights(AutoModelForCausalLM.from_pretrained(tiny_world["model"]), folders["hf_tied"])
    (tmp_path / "folders.json").write_text(json.dumps(folders))
    output = tmp_path / "loaded.json"
    argv = small_run_argv(tiny_world, str(tmp_path / "out"), use_rm_server="false", use_rule_reward="true", tensor_parallel_degree=2)
    logs = launch_two_processes(str(output), [str(tmp_path / "folders.json"), TINY_CONFIG, *argv], tmp_path / "log",
                                script=os.path.join(PROBES, "split_loading.py"))
    ranks = [json.loads(output.with_name(f"{output.name}.rank{rank}").read_text()) for rank in (0, 1)]
    for label in folders:
        for rank in ranks:
            assert rank[label]["names"] and rank[label]["max_difference"] == 0, label
            assert rank[label]["logits_difference"] == 0, label
            split = {"qwen2.layers.0.mlp.down_proj.weight"} | ({"lm_head.weight", "qwen2.embed_tokens.weight"} if label != "hf_tied" else set())
            assert split <= set(rank[label]["split_parameters"]), label
        assert ranks[0][label]["score_head"] == ranks[1][label]["score_head"], label
    assert logs[0].count("this rank read only its part") == 2 * len(folders)  # actor and critic of each folder


@pytest.mark.parametrize("processes", [2, 4], ids=["tp2", "tp2_by_dp2"])
def test_decoupled_rollout_serves_a_tensor_parallel_trainer(tiny_world, tmp_path, processes):
    """A TP2 trainer, alone or x DP2, with a CPU sampler (rollout_mode decoupled, no staleness): each version
    is published whole (the ranks gather it) and passes the weight-sync check; each group's first rank
    requests each of its batches once and shares it, and every ratio pi_theta / pi_old of the single update
    per batch is 1, so the sampler held exactly the policy the split trainer trains."""
    output_dir = tmp_path / "out"
    argv = tensor_parallel_argv(tiny_world, output_dir) + [
        "--rollout_mode", "decoupled", "--max_staleness", "0", "--kl_loss_coeff", "0", "--max_steps", "3", "--save_steps", "0",
    ]
    logs = launch_two_processes(TINY_CONFIG, argv, tmp_path / "log", processes=processes)
    steps = [{key: float(value) for key, value in m.items()} for m in step_metrics(logs[0])]
    assert [m["staleness"] for m in steps] == [0, 0, 0]
    for m in steps:
        assert abs(m["val/ratio"] - 1) < 1e-4 and m["val/ratio_var"] < 1e-8 and m["policy/clipfrac_avg"] == 0
    sampler_log = (output_dir / "rollout" / "sampler-0.log").read_text()
    assert sampler_log.count("loaded and checked policy version") == 3  # versions 0, 1 and 2
    assert sampler_log.count("sampling ") == 3 * processes // 2  # one request per step and group, not per rank
