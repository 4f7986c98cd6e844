"""Pipeline-parallel policy and value models, run as a single pipeline stage on CPU.

Each pipe is checked against the plain model it replaces (Qwen2ForCausalLM / LlamaForCausalLM with
PolicyObjective, Qwen2ForScore / LlamaForScore with ValueObjective) on the same weights and batch: same
loss and same gradient per parameter. The pipeline step is driven the way fleet's `train_batch` drives its
micro-batches: fleet's own FakeMicroDataset slices the packed inputs, the pipe's layers run forward, its
loss layer takes each micro-batch's labels, and losses are divided by the accumulation steps.
(`PipelineParallel.train_batch` itself cannot run with a single stage: the first and the last stage each
draw from the micro-batch stream, so one stage that is both draws twice per micro-batch.)
"""

import copy
import functools
import logging
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel.pipeline_parallel import FakeMicroDataset
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from paddlenlp.utils.log import logger as paddlenlp_logger

from paddle_alignment.algos.token_stats import position_ids_from_mask
from llm.alignment.ppo.models.model_pp import (
    REWARD_PIPES,
    LlamaPolicyPipe,
    LlamaValuePipe,
    Qwen2PolicyPipe,
    Qwen2ValuePipe,
    policy_pipe_class,
    value_pipe_class,
)
from llm.alignment.ppo.models.pp_model_utils import (
    NormalizedPairObjective,
    loss_scale_entry,
    micro_batch_groups,
    pad_micro_batches,
    policy_labels,
    same_width,
    split_pipeline_inputs,
)
from paddle_alignment.algos import PAIRWISE_LOSSES
from paddle_alignment.algos.losses import LossScale
from paddle_alignment.algos.pairwise import scored_pairs
from paddle_alignment.models.score_model_utils import build_normalizer
from paddle_alignment.models.ppo_model_utils import PolicyObjective, ValueObjective
from paddle_alignment.models.score_model import LlamaForScore, Qwen2ForScore

ARGS = SimpleNamespace(
    policy_loss="ppo_clip", kl_estimator="k3", loss_agg_mode="token-mean", kl_loss_coeff=0.1, entropy_coeff=0.01,
    clip_range_ratio_low=0.2, clip_range_ratio_high=0.28, clip_range_value=0.5, clip_ratio_c=3.0, temperature=0.7,
    pg_loss_coeff=1.0, sapo_tau_pos=1.0, sapo_tau_neg=1.05, max_dec_len=8, rollout_correction="token_tis",
    rollout_is_threshold=2.0, rollout_is_threshold_lower=0.5, max_turns=1, distill_coeff=0.0, distill_loss="reverse_kl",
    distill_beta=0.5,
)
TINY = dict(
    vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, dtype="float32",
)
# Qwen2 ties its embeddings like the project's tiny model; Llama keeps a separate LM head.
CONFIGS = {
    "qwen2": lambda: Qwen2Config(**TINY, tie_word_embeddings=True),
    "llama": lambda: LlamaConfig(**TINY, tie_word_embeddings=False),
}
PLAIN = {"qwen2": (Qwen2ForCausalLM, Qwen2ForScore), "llama": (LlamaForCausalLM, LlamaForScore)}
PIPES = {"qwen2": (Qwen2PolicyPipe, Qwen2ValuePipe), "llama": (LlamaPolicyPipe, LlamaValuePipe)}
PAD = TINY["pad_token_id"]
ACCUMULATE, MICRO = 2, 2


# Process state that fleet.init (and the ParallelEnv shim) writes, besides fleet.fleet's and fleet.util's own.
FLEET_GLOBALS = {
    "paddle.distributed.collective": (
        "_global_env", "_group_map", "_group_map_backend", "_group_map_by_name", "_start_ring_id",
    ),
    "paddle.distributed.parallel": ("_global_parallel_env",),
    "paddle.distributed.backup_env": ("g_backup_envs",),
    "paddle.distributed.fleet.base.topology": ("_HYBRID_PARALLEL_GROUP",),
}
MISSING = object()


@contextmanager
def restored_fleet_state():
    """Put back everything fleet.init changes (fleet's hcg, communication groups, ...), so that tests run
    later in the same process see no hybrid-parallel setup (comm_utils reads fleet.fleet._hcg)."""
    owners = [(sys.modules[module], name) for module, names in FLEET_GLOBALS.items() for name in names]
    owners.append((paddle.distributed.ParallelEnv, "_device_id"))
    saved = []
    for owner, name in owners:
        value = getattr(owner, name, MISSING)
        saved.append((owner, name, copy.copy(value) if isinstance(value, dict) else value))  # dicts fill in place
    instances = [(instance, dict(vars(instance))) for instance in (fleet.fleet, fleet.util)]
    try:
        yield
    finally:
        for instance, state in instances:
            vars(instance).clear()
            vars(instance).update(state)
        for owner, name, value in saved:
            if value is not MISSING:
                setattr(owner, name, value)
            elif hasattr(owner, name):
                delattr(owner, name)


@pytest.fixture(scope="module", autouse=True)
def single_stage_fleet():
    """fleet hybrid parallel with every degree 1 in this process, for the module only. PipelineLayer reads
    `ParallelEnv().device_id`, which a CPU process never sets: the class attribute is a test-only shim."""
    hcg_before = getattr(fleet.fleet, "_hcg", None)
    with restored_fleet_state():
        paddle.distributed.ParallelEnv._device_id = 0
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1}
        fleet.init(is_collective=True, strategy=strategy)
        yield
    assert getattr(fleet.fleet, "_hcg", None) is hcg_before


def rl_batch(rows, prompt_len, response_len, seed):
    """A micro-batch dict as the trainer packs one, with both models' keys: prompts left-padded and responses
    right-padded by different amounts per row, off-policy old log-probs (ratios beyond the clip range), the
    sampler's log-probs (ratios to them beyond the rollout correction's cap), a
    reference, advantages of both signs, old values and returns."""
    rng = np.random.default_rng(seed)
    width = prompt_len + response_len
    attention_mask = np.ones([rows, width], dtype="int64")
    for row in range(rows):
        attention_mask[row, : row % prompt_len] = 0  # at least one real prompt token
        attention_mask[row, prompt_len + 1 + (row * 3) % response_len :] = 0  # 1 to R response tokens
    input_ids = np.where(attention_mask == 1, rng.integers(1, TINY["vocab_size"], [rows, width]), PAD)
    response_shape = [rows, response_len]
    near_model_logprobs = -np.log(TINY["vocab_size"]) + rng.normal(0, 0.4, response_shape)
    values = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": attention_mask[:, prompt_len:].astype("float32"),
        "old_logprobs": near_model_logprobs,
        "ref_logprobs": near_model_logprobs + rng.normal(0, 0.3, response_shape),
        "rollout_logprobs": near_model_logprobs + rng.normal(0, 1.0, response_shape),
        "advantages": rng.normal(0, 1, response_shape),
        "old_values": rng.normal(0, 0.5, response_shape),
        "returns": rng.normal(0, 1, response_shape),
    }
    return {key: paddle.to_tensor(value, dtype="int64" if key in ("input_ids", "attention_mask") else "float32")
            for key, value in values.items()}


def split_rows(batch, size=MICRO):
    """Micro-batches of `size` rows of a batch dict (None entries stay None)."""
    starts = range(0, batch["input_ids"].shape[0], size)
    return [{key: None if value is None else value[i : i + size] for key, value in batch.items()} for i in starts]


def plain_logits(model, batch):
    """The trainer's call of the plain causal LM (ppo_trainer.response_logits)."""
    return model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        position_ids=position_ids_from_mask(batch["attention_mask"]), return_dict=True,
    ).logits


def plain_policy_loss(model, objective, batch):
    """The trainer's policy loss on a micro-batch (response_logits / response_labels of ppo_trainer.py)."""
    prompt_len = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
    logits = plain_logits(model, batch)
    return objective(
        logits[:, prompt_len - 1 : -1], batch["input_ids"][:, prompt_len:], batch["old_logprobs"],
        batch["ref_logprobs"], batch["advantages"], batch["response_mask"], rollout_logprobs=batch["rollout_logprobs"],
    )


def plain_value_loss(critic, objective, batch):
    """The trainer's value loss on a micro-batch (response_values of ppo_trainer.py)."""
    prompt_len = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
    scores = critic(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).scores
    values = scores[..., 0][:, prompt_len - 1 : -1]
    return objective(values, batch["old_values"], batch["returns"], batch["response_mask"])


def plain_step(loss_fn, micro_batches):
    """The plain trainer's accumulation: backward of each micro-batch loss / steps; (summed loss, stats)."""
    total, stats = 0.0, []
    for batch in micro_batches:
        loss, micro_stats = loss_fn(batch)
        (loss / len(micro_batches)).backward()
        total += float(loss) / len(micro_batches)
        stats.append({key: float(value) for key, value in micro_stats.items()})
    return total, stats


def pipeline_step(pipe, packed):
    """What `train_batch` does on a stage that is both first and last: fleet's FakeMicroDataset cuts the
    packed [inputs, labels] into micro-batches, the layers run forward, the loss layer takes the labels,
    and each loss is divided by the accumulation steps before its backward. Returns the summed loss."""
    total = 0.0
    for inputs, labels in FakeMicroDataset(packed, True, True, ACCUMULATE, MICRO):
        loss = pipe.pipeline_loss(pipe(inputs), labels) / ACCUMULATE
        loss.backward()
        total += float(loss)
    return total


def parameter_grads(model):
    """{plain parameter name: gradient}; pipes name their parameters like the plain model in state_dict()."""
    return {name: param.grad.numpy() for name, param in model.state_dict().items() if not param.stop_gradient}


def assert_same_grads(pipe, plain):
    pipe_grads, plain_grads = parameter_grads(pipe), parameter_grads(plain)
    assert set(pipe_grads) == {name for name, _ in plain.named_parameters()}
    for name, grad in pipe_grads.items():
        assert np.abs(plain_grads[name]).max() > 0, name
        np.testing.assert_allclose(grad, plain_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


def built_like(pipe_class, plain, objective):
    """A single-stage pipe holding the plain model's weights (a fresh config: pipes rewrite theirs)."""
    pipe = pipe_class(type(plain.config)(**plain.config.to_dict()), objective)
    pipe.set_state_dict(plain.state_dict())
    return pipe


def policy_pair(family, seed=0):
    paddle.seed(seed)
    plain = PLAIN[family][0](CONFIGS[family]())
    objective = PolicyObjective.from_args(ARGS)
    return plain, built_like(PIPES[family][0], plain, objective), objective


def value_pair(family, seed=0):
    paddle.seed(seed)
    critic = PLAIN[family][1](CONFIGS[family](), score_type="critic")
    objective = ValueObjective.from_args(ARGS)
    return critic, built_like(PIPES[family][1], critic, objective), objective


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_policy_pipe_matches_the_plain_model_loss_stats_and_gradients(family):
    """Micro-batches packed as a list (paddlenlp Trainer's form), one tensor per micro-batch per entry."""
    plain, pipe, objective = policy_pair(family)
    batch = rl_batch(ACCUMULATE * MICRO, 5, 4, seed=1)
    micro_batches = split_rows(batch)

    plain_loss, plain_stats = plain_step(lambda b: plain_policy_loss(plain, objective, b), micro_batches)
    pipe_loss = pipeline_step(pipe, pipe._prepare_pipeline_inputs_func(micro_batches))

    assert abs(pipe_loss - plain_loss) < 1e-5
    assert_same_grads(pipe, plain)
    pipe_stats = pipe.pipeline_loss.pop_stats()  # each micro-batch's, as the plain objective gave them
    assert len(pipe_stats) == len(plain_stats) == ACCUMULATE and "kl" in pipe_stats[0]
    for pipe_micro, plain_micro in zip(pipe_stats, plain_stats):
        assert pipe_micro == pytest.approx(plain_micro, abs=1e-5)
    assert max(stats["policy/clipfrac_avg"] for stats in pipe_stats) > 0  # the batch reaches the clipped region
    assert max(stats["rollout_corr/truncated_token_frac"] for stats in pipe_stats) > 0  # and the correction's cap
    assert pipe.pipeline_loss.pop_stats() == []


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_a_step_loss_scale_makes_each_micro_batch_loss_its_share_of_the_step(family):
    """With the step's LossScale in the labels (loss_scale_entry), the micro-batches' losses after fleet's
    division by the accumulation steps add up to the token mean over the whole step, as in the trainer's
    update, and so do the gradients."""
    plain, pipe, objective = policy_pair(family)
    batch = rl_batch(ACCUMULATE * MICRO, 5, 4, seed=6)
    micro_batches = split_rows(batch)
    step = LossScale(float(batch["response_mask"].sum()), ACCUMULATE * MICRO, 1, ARGS.max_dec_len)

    plain_total, plain_shares = 0.0, []
    for micro in micro_batches:
        prompt_len = micro["input_ids"].shape[1] - micro["response_mask"].shape[1]
        logits = plain_logits(plain, micro)
        share, stats = objective(logits[:, prompt_len - 1 : -1], micro["input_ids"][:, prompt_len:], micro["old_logprobs"],
                                 micro["ref_logprobs"], micro["advantages"], micro["response_mask"], step,
                                 rollout_logprobs=micro["rollout_logprobs"])
        share.backward()
        plain_total += float(share)
        plain_shares.append(float(stats["loss/policy_avg"]))
    scaled = [micro | {"loss_scale": loss_scale_entry(step, MICRO, ACCUMULATE)} for micro in micro_batches]
    pipe_total = pipeline_step(pipe, pipe._prepare_pipeline_inputs_func(scaled))

    assert pipe_total == pytest.approx(plain_total, abs=1e-6)
    assert_same_grads(pipe, plain)
    shares = [stats["loss/policy_avg"] for stats in pipe.pipeline_loss.pop_stats()]
    assert shares == pytest.approx(plain_shares, abs=1e-6)  # statistics are shares of the step too, as the trainer sums them


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_value_pipe_matches_the_plain_critic_loss_and_gradients(family):
    """One packed dict for the whole step, cut into micro-batches by fleet."""
    critic, pipe, objective = value_pair(family)
    batch = rl_batch(ACCUMULATE * MICRO, 5, 4, seed=2)
    micro_batches = split_rows(batch)

    plain_loss, _ = plain_step(lambda b: plain_value_loss(critic, objective, b), micro_batches)
    pipe_loss = pipeline_step(pipe, pipe._prepare_pipeline_inputs_func(batch))

    assert abs(pipe_loss - plain_loss) < 1e-5
    assert_same_grads(pipe, critic)
    assert max(stats["val/clipfrac_avg"] for stats in pipe.pipeline_loss.pop_stats()) > 0


def pair_batch(pairs, width, seed):
    """A collated batch of `pairs` preference pairs (better rows, then worse), right-padded to `width`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, width + 1, 2 * pairs)
    lengths[0] = width
    mask = (np.arange(width)[None] < lengths[:, None]).astype("int64")
    ids = np.where(mask == 1, rng.integers(1, TINY["vocab_size"], [2 * pairs, width]), PAD)
    return {"input_ids": paddle.to_tensor(ids, dtype="int64"), "attention_mask": paddle.to_tensor(mask, dtype="int64")}


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("loss_type", ["sequence-wise", "token-wise"])
def test_reward_pipe_trains_as_the_plain_score_model_with_its_normalizer(family, loss_type):
    """A step of two collated batches of different widths, as paddlenlp's Trainer hands them (padded to one
    width by the pipe): the pipe's loss and gradients are the plain reward model's in training, its scores
    normalized by running statistics that each forward updates (do_normalize), which end the same."""
    paddle.seed(0)
    plain = PLAIN[family][1](CONFIGS[family](), score_type="reward", normalizer_type="ExponentialMovingAverage", do_normalize=True)
    pair_loss = functools.partial(scored_pairs, PAIRWISE_LOSSES.get(loss_type), regularization=0.01)
    normalizer = build_normalizer("ExponentialMovingAverage", 1, 0.9)
    pipe = built_like(REWARD_PIPES[family], plain, NormalizedPairObjective(pair_loss, normalizer, True, None))
    micro_batches = [pair_batch(MICRO, 6, seed=6), pair_batch(MICRO, 4, seed=7)]

    def plain_loss(batch):
        scores = plain(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).scores[..., 0]
        return pair_loss(scores, batch["input_ids"], batch["attention_mask"])[0], {}

    plain_total, _ = plain_step(plain_loss, micro_batches)
    packed = pipe._prepare_pipeline_inputs_func(micro_batches)
    assert {tuple(ids.shape) for ids in packed[0][0]} == {(2 * MICRO, 6)}
    assert abs(pipeline_step(pipe, packed) - plain_total) < 1e-5
    assert_same_grads(pipe, plain)
    for name in ("mean", "var", "count"):
        np.testing.assert_allclose(getattr(normalizer, name).numpy(), getattr(plain.normalizer, name).numpy(), rtol=1e-6)
    assert float(normalizer.count) == 2 * 2 * MICRO


def test_same_width_pads_a_steps_batches_on_the_right_and_names_a_key_without_a_pad_value():
    wide, narrow = pair_batch(2, 5, seed=8), pair_batch(2, 3, seed=9)
    padded = same_width([wide, narrow], {"input_ids": 0, "attention_mask": 0})
    assert padded[0] is not wide and np.array_equal(padded[0]["input_ids"].numpy(), wide["input_ids"].numpy())
    np.testing.assert_array_equal(padded[1]["attention_mask"].numpy()[:, :3], narrow["attention_mask"].numpy())
    assert padded[1]["attention_mask"].numpy()[:, 3:].sum() == 0 and padded[1]["input_ids"].shape == [4, 5]
    with pytest.raises(ValueError, match=r"micro-batches' \['labels'\] to one width"):
        same_width([wide, narrow | {"labels": narrow["input_ids"]}], {"input_ids": 0, "attention_mask": 0})


def test_absent_old_and_reference_logprobs_travel_as_zero_width_tensors():
    """On-policy without a reference or the sampler's log-probs: the labels carry [b, 0] tensors and the loss
    reads them as None."""
    plain, pipe, objective = policy_pair("qwen2")
    batch = rl_batch(ACCUMULATE * MICRO, 5, 4, seed=3) | {"old_logprobs": None, "ref_logprobs": None, "rollout_logprobs": None}
    micro_batches = split_rows(batch)

    packed = pipe._prepare_pipeline_inputs_func(batch)
    absent = [packed[1][1], packed[1][2], packed[1][5]]  # old, reference and rollout log-probs
    assert [tuple(label.shape) for label in absent] == [(ACCUMULATE * MICRO, 0)] * 3
    plain_loss, _ = plain_step(lambda b: plain_policy_loss(plain, objective, b), micro_batches)
    pipe_loss = pipeline_step(pipe, packed)

    assert abs(pipe_loss - plain_loss) < 1e-5
    assert_same_grads(pipe, plain)
    for stats in pipe.pipeline_loss.pop_stats():
        assert "kl" not in stats and not any(key.startswith("rollout_corr/") for key in stats)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_padding_micro_batches_to_one_shape_leaves_each_loss_unchanged(family):
    (_, policy, _), (_, value, _) = policy_pair(family), value_pair(family)
    micro_batches = [rl_batch(MICRO, 5, 4, seed=4), rl_batch(MICRO, 3, 6, seed=5)]

    def losses(pipe, batches):
        micro_dataset = FakeMicroDataset(pipe._prepare_pipeline_inputs_func(batches), True, True, ACCUMULATE, MICRO)
        with paddle.no_grad():
            return [float(pipe.pipeline_loss(pipe(inputs), labels)) for inputs, labels in micro_dataset]

    to_largest = pad_micro_batches(micro_batches, PAD)
    to_fixed = pad_micro_batches(micro_batches, PAD, prompt_len=8, response_len=7)
    for padded in (to_largest, to_fixed):
        widths = {(b["input_ids"].shape[1], b["response_mask"].shape[1], b["advantages"].shape[1]) for b in padded}
        assert len(widths) == 1
        for pipe in (policy, value):
            np.testing.assert_allclose(losses(pipe, padded), losses(pipe, micro_batches), atol=1e-5)
    short_prompts = to_largest[1]  # its prompts gain 2 positions on the left
    assert short_prompts["input_ids"][:, :2].abs().sum() == 0 and short_prompts["attention_mask"][:, :2].sum() == 0
    with pytest.raises(ValueError, match="smaller"):
        pad_micro_batches(micro_batches, PAD, response_len=5)


def test_micro_batch_groups_drop_the_remainder_only_with_drop_last(caplog):
    assert micro_batch_groups(8, 2, 2, drop_last=False) == [[(0, 2), (2, 4)], [(4, 6), (6, 8)]]
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=2 x gradient_accumulation_steps=2"):
        micro_batch_groups(10, 2, 2, drop_last=False)
    paddlenlp_logger.logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=paddlenlp_logger.logger.name):
            assert micro_batch_groups(11, 2, 2, drop_last=True) == [[(0, 2), (2, 4)], [(4, 6), (6, 8)]]
    finally:
        paddlenlp_logger.logger.removeHandler(caplog.handler)
    assert "dropping 3 of 11 rows" in caplog.text
    with pytest.raises(ValueError, match="smaller than"):
        micro_batch_groups(3, 2, 2, drop_last=True)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_checkpoints_round_trip_between_plain_models_and_pipes(family, tmp_path):
    plain, _, policy_objective = policy_pair(family, seed=6)
    critic, _, value_objective = value_pair(family, seed=7)
    plain.save_pretrained(str(tmp_path / "causal_lm"))
    critic.save_pretrained(str(tmp_path / "critic"))
    batch = rl_batch(3, 4, 3, seed=8)
    inputs = split_pipeline_inputs(batch, policy_labels)[0]

    def scores(model):
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).scores.numpy()

    policy = policy_pipe_class(plain.config).from_pretrained(str(tmp_path / "causal_lm"), objective=policy_objective)
    value = value_pipe_class(critic.config).from_pretrained(str(tmp_path / "critic"), objective=value_objective)
    policy.save_pretrained(str(tmp_path / "policy_pipe"))
    value.save_pretrained(str(tmp_path / "value_pipe"))
    plain_again = type(plain).from_pretrained(str(tmp_path / "policy_pipe"))
    critic_again = type(critic).from_pretrained(str(tmp_path / "value_pipe"))
    with paddle.no_grad():
        expected_logits, expected_scores = plain_logits(plain, batch).numpy(), scores(critic)
        np.testing.assert_allclose(policy(inputs).numpy(), expected_logits, atol=1e-6)
        np.testing.assert_allclose(value(inputs).numpy(), expected_scores, atol=1e-6)
        np.testing.assert_allclose(plain_logits(plain_again, batch).numpy(), expected_logits, atol=1e-6)
        np.testing.assert_allclose(scores(critic_again), expected_scores, atol=1e-6)
    assert critic_again.config.score_type == "critic"

    # A critic started from the causal LM: its backbone, a fresh score head, score settings from the call.
    fresh = value_pipe_class(plain.config).from_pretrained(
        str(tmp_path / "causal_lm"), objective=value_objective, score_type="critic"
    )
    weights, plain_weights = fresh.state_dict(), plain.state_dict()
    backbone = [name for name in weights if not name.startswith("score_head.")]
    assert len(backbone) == len(weights) - 2 and all(name in plain_weights for name in backbone)
    for name in backbone:
        np.testing.assert_array_equal(weights[name].numpy(), plain_weights[name].numpy())
    assert weights["score_head.weight"].shape == [TINY["hidden_size"], 1] and fresh.config.score_type == "critic"


def test_packed_bool_mask_survives_the_llama_pipes_gpu_reading(monkeypatch):
    """On GPU, paddlenlp's Llama pipe takes an int64 tensor in the mask slot for position ids; the packed
    bool mask is read as a mask. (The GPU branch is forced on CPU by patching the device query.)"""
    import paddlenlp.transformers.llama.modeling_pp as llama_pp

    plain, pipe, _ = policy_pair("llama", seed=9)
    batch = rl_batch(3, 4, 3, seed=10)
    inputs = split_pipeline_inputs(batch, policy_labels)[0]
    monkeypatch.setattr(llama_pp, "get_env_device", lambda: "gpu")
    with paddle.no_grad():
        expected = plain_logits(plain, batch).numpy()
        np.testing.assert_allclose(pipe(inputs).numpy(), expected, atol=1e-6)
        int_mask_inputs = (inputs[0], batch["attention_mask"], None, inputs[3])
        assert np.abs(pipe(int_mask_inputs).numpy() - expected).max() > 1e-3


def test_value_pipe_refuses_normalized_scores_and_unknown_models():
    with pytest.raises(ValueError, match="do_normalize"):
        Qwen2ValuePipe(CONFIGS["qwen2"](), ValueObjective.from_args(ARGS), do_normalize=True)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        policy_pipe_class(SimpleNamespace(model_type="gpt2"))
    assert value_pipe_class(CONFIGS["llama"]()) is LlamaValuePipe
