"""The RL math where it used to depart from the reference implementations (verl, TRL, OpenRLHF): each
test ports the reference formula to NumPy or uses a number worked out by hand, and failed before the fix."""

import os

import numpy as np
import paddle
import pytest

from helpers import REPO_ROOT, paddlenlp_messages as paddlenlp_warnings, parse, small_run_argv
from llm.alignment.ppo import run_ppo
from paddle_alignment.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from paddle_alignment.algos.losses import LossScale
from paddle_alignment.algos.registry import Registry
from paddle_alignment.algos.reward_shaping import shape_rewards
from paddle_alignment.models import ppo_model_utils
from paddle_alignment.models.ppo_model_utils import PolicyObjective, response_labels, response_logits
from paddle_alignment.rollout.decode import generate_rollouts

TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")


def t(values, dtype="float32"):
    return paddle.to_tensor(values, dtype=dtype)


def objective(policy_loss="ppo_clip", aggregate="token-mean", **changes):
    settings = dict(kl_loss_coeff=0.0, entropy_coeff=0.0, clip_range_ratio_low=0.2, clip_range_ratio_high=0.2,
                    clip_ratio_c=0.0, temperature=1.0)
    settings.update(changes)
    return PolicyObjective(policy_loss, "k3", aggregate, **settings)


# ---- temperature -------------------------------------------------------------------------------------


def test_temperature_logprob_and_entropy_are_those_of_the_sampling_distribution():
    # verl (dp_actor: logits.div_(temperature)), TRL and OpenRLHF: logits [2, 1, 0, -1] at T = 0.6, token 0:
    # log pi = -0.2081 and entropy 0.5877 (at T = 1, which the project used before: -0.4402 and 0.9475).
    logits = t([[[2.0, 1.0, 0.0, -1.0]]])
    labels = t([[0]], dtype="int64")
    tempered = objective(temperature=0.6)
    logprob = tempered.token_logprobs(logits, labels)
    assert float(logprob) == pytest.approx(-0.2081, abs=1e-4)
    _, stats = tempered(logits, labels, logprob, None, t([[1.0]]), t([[1.0]]))
    assert float(stats["entropy"]) == pytest.approx(0.5877, abs=1e-4)
    # The loss's log-probs are the same formula: on the old log-probs of token_logprobs the ratio is 1.
    assert float(stats["val/ratio"]) == pytest.approx(1.0, abs=1e-7)


def test_trainer_logprobs_use_the_sampling_temperature(tiny_world, tmp_path):
    trainer = run_ppo.build_trainer(
        [TINY_CONFIG, *small_run_argv(tiny_world, str(tmp_path), use_rm_server="false", use_rule_reward="true", temperature=0.7)]
    )
    batch = [trainer.train_dataset[i] for i in range(2)]
    exp = generate_rollouts(trainer.model, trainer.tokenizer, batch, 2, trainer.rollout.worker.sampling)
    old = trainer.rollout.worker.compute_logprobs(trainer.model, exp).numpy()  # the path of old and reference log-probs
    with paddle.no_grad():
        logits = response_logits(trainer.model, exp).astype("float32").numpy() / 0.7
    log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    expected = np.take_along_axis(log_softmax, response_labels(exp).numpy()[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(old, expected, rtol=1e-5, atol=1e-5)


# ---- token-mean over the optimizer step ----------------------------------------------------------------


def test_token_mean_is_the_mean_over_every_token_of_the_step_across_micro_batches():
    # Two responses of 1 and 3 tokens, advantages 2 and 1, on policy (ratio 1): the per-token losses are
    # -2 and -1, -1, -1. Over the whole step (verl's global token mean, TRL's dapo): -5 / 4 = -1.25; the
    # old per-micro-batch mean averaged over 2 accumulation steps gave (-2 + -1) / 2 = -1.5.
    logits = paddle.to_tensor(np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32"), stop_gradient=False)
    labels = t([[1, 0, 0], [2, 3, 4]], dtype="int64")
    mask, advantages = t([[1, 0, 0], [1, 1, 1]]), t([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]])
    token_mean = objective()
    whole, _ = token_mean(logits, labels, None, None, advantages, mask)
    (whole_grad,) = paddle.grad(whole, logits)
    scale = LossScale(tokens=4.0, sequences=2.0)
    shares = [token_mean(logits[i : i + 1], labels[i : i + 1], None, None, advantages[i : i + 1], mask[i : i + 1], scale=scale)[0] for i in range(2)]
    (accumulated_grad,) = paddle.grad(shares[0] + shares[1], logits)
    assert float(whole) == pytest.approx(-1.25, abs=1e-6)
    assert float(shares[0] + shares[1]) == pytest.approx(-1.25, abs=1e-6)
    np.testing.assert_allclose(accumulated_grad.numpy(), whole_grad.numpy(), rtol=1e-6, atol=1e-7)


def test_loss_scale_multiplies_back_the_data_parallel_average():
    # Each of 2 ranks' gradients is averaged by data parallel: a rank's share times 2 / 2 sums to the global mean.
    values, mask = t([[1.0, 2.0], [3.0, 0.0]]), t([[1, 1], [1, 0]])
    scale = LossScale(tokens=6.0, sequences=4.0, ranks=2)
    assert float(LOSS_AGGREGATIONS.get("token-mean")(values, mask, scale)) == pytest.approx(6 / 6 * 2)
    assert float(LOSS_AGGREGATIONS.get("seq-mean-token-mean")(values, mask, scale)) == pytest.approx((1.5 + 3) / 4 * 2)
    assert float(LOSS_AGGREGATIONS.get("seq-mean-token-sum")(values, mask, scale)) == pytest.approx((3 + 3) / 4 * 2)


def fixed_step_metrics(world, tmp_path, **changes):
    """One GRPO step of run_ppo on the fixed rollouts of tests/probes/grpo_first_step.py, and the policy after it."""
    import grpo_first_step

    argv = small_run_argv(world, str(tmp_path), use_rm_server="false", use_rule_reward="true", max_steps=1, **changes)
    trainer, exp, metrics = grpo_first_step.first_steps_metrics([TINY_CONFIG, *argv])
    return exp, metrics, {name: p.numpy() for name, p in trainer.model.named_parameters()}


def test_token_mean_with_gradient_accumulation_equals_one_micro_batch(tiny_world, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO_ROOT, "tests", "probes"))
    exp, one, weights_one = fixed_step_metrics(tiny_world, tmp_path / "one", per_device_train_batch_size=16)
    _, two, weights_two = fixed_step_metrics(
        tiny_world, tmp_path / "two", per_device_train_batch_size=8, gradient_accumulation_steps=2
    )
    halves = exp.response_mask.sum(axis=1).numpy().reshape(2, 8).sum(axis=1)
    assert halves[0] != halves[1], halves  # micro-batches of different token counts: a per-micro-batch mean differs
    assert one["grad_norm"] > 1e-3
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert two["loss/policy_avg"] == pytest.approx(one["loss/policy_avg"], rel=1e-5, abs=1e-7)
    for name, value in weights_one.items():
        np.testing.assert_allclose(weights_two[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_by_token_budget_train_as_the_fixed_split(tiny_world, tmp_path, monkeypatch, loss_agg_mode):
    """The update's rows ordered by length into micro-batches of at most 60 padded tokens, each cut to its
    rows' width, give the step that micro-batches of 16 rows padded to the batch's width give (and the
    reference log-probs are taken the same two ways)."""
    monkeypatch.syspath_prepend(os.path.join(REPO_ROOT, "tests", "probes"))
    common = dict(per_device_train_batch_size=16, loss_agg_mode=loss_agg_mode, kl_loss_coeff=0.1)
    _, fixed, weights_fixed = fixed_step_metrics(tiny_world, tmp_path / "fixed", use_dynamic_batch_size="false", **common)
    _, dynamic, weights_dynamic = fixed_step_metrics(
        tiny_world, tmp_path / "dynamic", use_dynamic_batch_size="true", max_token_len_per_device=60, **common
    )
    assert dynamic["update_padding_ratio"] <= fixed["update_padding_ratio"]
    assert dynamic["grad_norm"] == pytest.approx(fixed["grad_norm"], rel=1e-5)
    assert dynamic["loss/policy_avg"] == pytest.approx(fixed["loss/policy_avg"], rel=1e-5, abs=1e-7)
    assert dynamic["kl"] == pytest.approx(fixed["kl"], rel=1e-4, abs=1e-7)
    for name, value in weights_fixed.items():
        np.testing.assert_allclose(weights_dynamic[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_shared_prompt_forward_trains_as_whole_rows(tiny_world, tmp_path, monkeypatch):
    """share_prompt_forward: the update's micro-batch of 16 rows (four prompts' 4 samples each) runs each prompt
    once; the step is the one whole rows give."""
    monkeypatch.syspath_prepend(os.path.join(REPO_ROOT, "tests", "probes"))
    common = dict(per_device_train_batch_size=16, kl_loss_coeff=0.1)
    _, whole, weights_whole = fixed_step_metrics(tiny_world, tmp_path / "whole", **common)
    shared_calls = []
    original = ppo_model_utils.shared_prompt_hidden
    monkeypatch.setattr(ppo_model_utils, "shared_prompt_hidden", lambda *a: shared_calls.append(1) or original(*a))
    _, shared, weights_shared = fixed_step_metrics(tiny_world, tmp_path / "shared", share_prompt_forward="true", **common)
    assert shared_calls  # the update took the shared path
    assert shared["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert shared["loss/policy_avg"] == pytest.approx(whole["loss/policy_avg"], rel=1e-5, abs=1e-7)
    for name, value in weights_whole.items():
        np.testing.assert_allclose(weights_shared[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# ---- GSPO aggregates per sequence --------------------------------------------------------------------


def numpy_gspo(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    """verl's compute_policy_loss_gspo, value only: one clipped ratio per sequence, seq-mean-token-mean."""
    lengths = mask.sum(-1)
    ratio = np.exp(((logprobs - old_logprobs) * mask).sum(-1) / lengths)[:, None]
    token_loss = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 1 - clip_low, 1 + clip_high))
    return ((token_loss * mask).sum(-1) / lengths).mean()


def test_gspo_aggregates_per_sequence_whatever_loss_agg_mode_says(tmp_path):
    with paddlenlp_warnings() as warnings:
        _, _, args = parse(tmp_path, policy_loss="gspo", loss_agg_mode="token-mean")
    assert args.loss_agg_mode == "seq-mean-token-mean"
    assert any("loss_agg_mode='token-mean' is replaced by 'seq-mean-token-mean'" in w for w in warnings), warnings
    assert parse(tmp_path, policy_loss="gspo")[2].loss_agg_mode == "seq-mean-token-mean"
    assert parse(tmp_path)[2].loss_agg_mode == "token-mean"

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(3, 4, 6)).astype("float32")
    labels = rng.integers(0, 6, size=(3, 4))
    mask = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype="float32")
    advantages = np.repeat(rng.normal(size=(3, 1)), 4, axis=1).astype("float32")
    gspo = PolicyObjective.from_args(args)
    logprobs = gspo.token_logprobs(t(logits), t(labels, "int64")).numpy()
    old = (logprobs + rng.normal(scale=0.3, size=logprobs.shape)).astype("float32")
    loss, _ = gspo(t(logits), t(labels, "int64"), t(old), None, t(advantages), t(mask))
    expected = numpy_gspo(logprobs, old, advantages, mask, args.clip_range_ratio_low, args.clip_range_ratio_high)
    assert float(loss) == pytest.approx(expected, rel=1e-5)


# ---- k3 clamp, dual clip ------------------------------------------------------------------------------


def numpy_verl_low_var_kl(logprob, ref_logprob):
    """verl core_algos.kl_penalty(..., "low_var_kl")."""
    kl = np.clip(ref_logprob - logprob, -20, 20)
    return np.clip(np.exp(kl) - kl - 1, -10, 10)


def test_k3_is_clamped_as_verl_does():
    logprobs = np.array([[-100.0, -30.0, -1.0, -0.5, -3.0, -12.0]], dtype="float32")
    ref = np.array([[0.0, -1.0, -1.2, -4.0, -0.1, -0.2]], dtype="float32")
    k3 = KL_ESTIMATORS.get("k3")(t(logprobs), t(ref)).numpy()
    np.testing.assert_allclose(k3, numpy_verl_low_var_kl(logprobs, ref), rtol=1e-5)
    assert k3[0, 0] == 10.0 and k3[0, 1] == 10.0  # not exp(20) - 21 = 4.85e8, nor exp(29) - 30


def numpy_verl_dual_clip(log_ratio, advantages, clip_low, clip_high, clip_ratio_c):
    """verl core_algos.compute_policy_loss_vanilla's per-token loss and pg_clipfrac_lower."""
    ratio = np.exp(log_ratio)
    loss1 = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 1 - clip_low, 1 + clip_high))
    loss3 = -advantages * clip_ratio_c
    losses = np.where(advantages < 0, np.minimum(loss3, loss1), loss1)
    return losses, ((loss1 > loss3) & (advantages < 0)).mean()


def test_dual_clip_caps_negative_advantage_tokens_as_verl_does():
    # A = -1 and ratio 5: PPO's clip leaves -A * 5 = 5 (the clip bounds only ratios below 1 - eps for A < 0);
    # dual clip with c = 3 caps it at 3.
    ppo_clip = POLICY_LOSSES.get("ppo_clip")
    log_ratio = paddle.to_tensor([[np.log(5.0)]], dtype="float32", stop_gradient=False)
    loss, stats = ppo_clip(log_ratio, t([[0.0]]), t([[-1.0]]), t([[1.0]]), 0.2, 0.2, clip_ratio_c=3.0)
    assert float(loss) == pytest.approx(3.0) and float(stats["clipfrac_dual"]) == 1.0
    (grad,) = paddle.grad(loss.sum(), log_ratio)
    assert float(grad) == 0.0  # the capped token pushes no further
    assert float(ppo_clip(log_ratio, t([[0.0]]), t([[-1.0]]), t([[1.0]]), 0.2, 0.2)[0]) == pytest.approx(5.0)

    rng = np.random.default_rng(4)
    log_ratio = rng.normal(scale=1.5, size=(6, 8)).astype("float32")
    advantages = rng.normal(size=(6, 8)).astype("float32")
    loss, stats = ppo_clip(t(log_ratio), t(np.zeros_like(log_ratio)), t(advantages), t(np.ones_like(log_ratio)), 0.2, 0.28, clip_ratio_c=3.0)
    expected, capped = numpy_verl_dual_clip(log_ratio, advantages, 0.2, 0.28, 3.0)
    assert capped > 0
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert float(stats["clipfrac_dual"]) == pytest.approx(capped)


def test_clip_ratio_c_reaches_the_objective_and_is_checked(tmp_path):
    _, _, args = parse(tmp_path)
    assert args.clip_ratio_c == 3.0 and PolicyObjective.from_args(args).clip_ratio_c == 3.0
    assert parse(tmp_path, clip_ratio_c=0)[2].clip_ratio_c == 0
    with pytest.raises(ValueError, match="clip_ratio_c=0.5 must be > 1"):
        parse(tmp_path, clip_ratio_c=0.5)


def test_pg_loss_coeff_weights_the_policy_gradient_term_only():
    # PaddleNLP's pg_loss_coeff: loss = c x policy loss + kl_loss_coeff x KL (the KL term unscaled).
    rng = np.random.default_rng(7)
    logits, labels = t(rng.normal(size=(2, 3, 5))), paddle.to_tensor(rng.integers(0, 5, size=(2, 3)))
    old, ref, adv, mask = t(rng.normal(size=(2, 3)) - 2), t(rng.normal(size=(2, 3)) - 2), t(rng.normal(size=(2, 3))), t(np.ones((2, 3)))
    terms = {}
    for pg, kl in [(1.0, 0.0), (0.5, 0.0), (0.0, 0.3), (0.5, 0.3)]:
        terms[pg, kl] = float(objective(pg_loss_coeff=pg, kl_loss_coeff=kl)(logits, labels, old, ref, adv, mask)[0])
    assert terms[0.5, 0.0] == pytest.approx(0.5 * terms[1.0, 0.0], rel=1e-6)
    assert terms[0.5, 0.3] == pytest.approx(terms[0.5, 0.0] + terms[0.0, 0.3], rel=1e-6)


# ---- keys that an algorithm does not use, registry traits -----------------------------------------------


def test_kl_coeff_with_an_algorithm_that_ignores_it_warns(tmp_path):
    with paddlenlp_warnings() as warnings:
        _, _, args = parse(tmp_path, rl_algorithm="grpo", kl_coeff=0.02)
    assert not args.kl_in_reward
    assert any("kl_coeff=0.02 has no effect with rl_algorithm=grpo" in w for w in warnings), warnings
    with paddlenlp_warnings() as warnings:
        assert parse(tmp_path, rl_algorithm="reinforce_plus_plus", kl_coeff=0.02)[2].kl_in_reward
    assert not any("kl_coeff" in w for w in warnings)


def test_arguments_derive_what_an_algorithm_needs_from_its_registry_traits(tmp_path):
    expected = {"grpo": (False, False, True), "rloo": (False, False, True), "ppo": (True, True, False),
                "reinforce_plus_plus": (False, True, False)}
    for name, (critic, kl_in_reward, group_baseline) in expected.items():
        traits = ADVANTAGE_ESTIMATORS.traits(name)
        assert (traits.critic, traits.kl_in_reward, traits.group_baseline) == (critic, kl_in_reward, group_baseline)
    assert parse(tmp_path, rl_algorithm="ppo")[2].uses_critic
    with pytest.raises(ValueError, match="rloo compares samples of one prompt"):
        parse(tmp_path, rl_algorithm="rloo", rollout_n=1, per_device_train_batch_size=2)
    with pytest.raises(ValueError, match="unknown traits \\['critc'\\]"):
        Registry("test", critic=False).register("x", critc=True)


# ---- reward shaping ------------------------------------------------------------------------------------


def test_shape_rewards_applies_penalties_normalisation_and_clip_in_order():
    scores, finished, lengths = t([1.0, 3.0, -4.0]), paddle.to_tensor([True, False, True]), t([2.0, 10.0, 9.0])
    # missing EOS -0.5 on row 1; overlong (max 10, buffer 4): row 1 -1 * 1.0, row 2 -0.75 * 1.0;
    # normalize doubles; clip to +-3.
    rewards = shape_rewards(scores, finished, lengths, 0.5, 10, 4, 1.0, normalize=lambda r: 2 * r, clip_range=3.0)
    np.testing.assert_allclose(rewards.numpy(), [2.0, 3.0, -3.0])
    np.testing.assert_allclose(shape_rewards(scores, finished, lengths).numpy(), scores.numpy())
