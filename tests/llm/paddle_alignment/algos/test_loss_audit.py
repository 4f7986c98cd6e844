"""The loss pieces an audit against verl, TRL and OpenRLHF asked for, each against a NumPy port of its
published formula (values and gradients), and the edge cases that audit found: log-ratios far outside any
clip range, and the value clip on tokens it does not clip."""

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from paddle_alignment.algos.advantages import kl_shaped_token_rewards
from paddle_alignment.algos.losses import LossScale, clipped_value_loss

RNG = np.random.default_rng(7)
B, R = 6, 9


def t(values, dtype="float64"):
    return paddle.to_tensor(np.asarray(values), dtype=dtype)


def random_batch():
    """Log-probs, old log-probs (log-ratios within about +-0.6), advantages per sequence and a ragged mask."""
    logprobs = RNG.uniform(-3.0, -0.1, size=(B, R))
    old = logprobs + RNG.normal(scale=0.3, size=(B, R))
    advantages = np.repeat(RNG.normal(size=(B, 1)), R, axis=1)
    lengths = RNG.integers(1, R + 1, size=B)
    mask = (np.arange(R)[None, :] < lengths[:, None]).astype("float64")
    return logprobs, old, advantages, mask


def loss_and_grad(name, logprobs, old, advantages, mask, aggregation, **options):
    """The aggregated loss and its gradient with respect to the log-probs, in float64."""
    current = t(logprobs)
    current.stop_gradient = False
    token_loss, stats = POLICY_LOSSES.get(name)(current, t(old), t(advantages), t(mask), **options)
    loss = LOSS_AGGREGATIONS.get(aggregation)(token_loss, t(mask))
    loss.backward()
    return float(loss), current.grad.numpy(), stats


def numpy_token_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def numpy_seq_mean_token_mean(values, mask):
    return ((values * mask).sum(-1) / mask.sum(-1)).mean()


def test_cispo_matches_its_formula():
    logprobs, old, advantages, mask = random_batch()
    low, high = 1.0, 0.2  # the paper's: no lower bound, a tuned upper one
    loss, grad, stats = loss_and_grad("cispo", logprobs, old, advantages, mask, "token-mean", clip_range_ratio_low=low, clip_range_ratio_high=high)
    weight = np.clip(np.exp(logprobs - old), 1.0 - low, 1.0 + high)
    # J = sg(w) * A * log pi, so the gradient of -J is -w * A, per token, over the step's valid tokens.
    assert loss == pytest.approx(numpy_token_mean(-weight * advantages * logprobs, mask), rel=1e-12)
    np.testing.assert_allclose(grad, -weight * advantages * mask / mask.sum(), rtol=1e-12, atol=1e-15)
    clipped_high = (np.exp(logprobs - old) > 1.0 + high) * mask
    assert float(stats["clipfrac_high"]) == pytest.approx(clipped_high.sum() / mask.sum())
    assert clipped_high.sum() > 0 and float(stats["clipfrac_low"]) == 0.0


def test_sapo_matches_its_formula():
    logprobs, old, advantages, mask = random_batch()
    loss, grad, _ = loss_and_grad("sapo", logprobs, old, advantages, mask, "token-mean", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    ratio = np.exp(logprobs - old)
    tau = np.where(advantages > 0, 1.0, 1.05)
    gate = 1.0 / (1.0 + np.exp(-tau * (ratio - 1.0)))
    assert loss == pytest.approx(numpy_token_mean(-(4.0 / tau) * gate * advantages, mask), rel=1e-12)
    # d/dlog pi of -(4/tau) sigmoid(tau (r - 1)) A = -4 sigmoid' r A: at r = 1 it is -A, the policy gradient.
    expected = -4.0 * gate * (1.0 - gate) * ratio * advantages * mask / mask.sum()
    np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-15)


def test_sapo_on_policy_is_the_policy_gradient():
    logprobs, _, advantages, mask = random_batch()
    _, grad, _ = loss_and_grad("sapo", logprobs, logprobs, advantages, mask, "token-mean", sapo_tau_pos=0.3, sapo_tau_neg=2.0)
    np.testing.assert_allclose(grad, -advantages * mask / mask.sum(), rtol=1e-12, atol=1e-15)


def numpy_gmpo(logprobs, old, advantages, mask, low, high):
    """verl's compute_policy_loss_geo_mean, ported: the sign-aware clipped token log-ratios' mean per
    sequence, exponentiated, times minus the sequence's mean advantage; mean over sequences."""
    log_ratio = logprobs - old
    sign = np.sign(advantages)
    pessimistic = sign * np.minimum(sign * log_ratio, sign * np.clip(log_ratio, -low, high))
    ratio = np.exp((pessimistic * mask).sum(-1) / mask.sum(-1))
    advantage = (advantages * mask).sum(-1) / mask.sum(-1)
    return np.mean(-advantage * ratio)


def test_gmpo_matches_its_formula():
    logprobs, old, advantages, mask = random_batch()
    low, high = 0.4, 0.4
    loss, grad, _ = loss_and_grad("gmpo", logprobs, old, advantages, mask, "seq-mean-token-mean", clip_range_ratio_low=low, clip_range_ratio_high=high)
    assert loss == pytest.approx(numpy_gmpo(logprobs, old, advantages, mask, low, high), rel=1e-12)
    numeric = np.zeros_like(logprobs)
    for index in np.ndindex(*logprobs.shape):
        step = np.zeros_like(logprobs)
        step[index] = 1e-6
        numeric[index] = (numpy_gmpo(logprobs + step, old, advantages, mask, low, high)
                          - numpy_gmpo(logprobs - step, old, advantages, mask, low, high)) / 2e-6
    np.testing.assert_allclose(grad, numeric, atol=1e-8)


def test_gmpo_is_aggregated_per_sequence():
    from paddle_alignment.config.algorithm import AlgorithmArguments

    args = AlgorithmArguments(policy_loss="gmpo", loss_agg_mode="token-mean")
    args.resolve_loss_agg_mode()
    assert args.loss_agg_mode == "seq-mean-token-mean"


def test_seq_mean_token_sum_norm_divides_by_the_response_budget():
    values = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    aggregate = LOSS_AGGREGATIONS.get("seq-mean-token-sum-norm")
    # (6 + 4) over 2 responses x a budget of 8 tokens; without a step's scale, the budget is the width (3).
    scale = LossScale(tokens=4.0, sequences=2.0, response_budget=8)
    assert float(aggregate(values, mask, scale)) == pytest.approx(10 / (2 * 8))
    assert float(aggregate(values, mask)) == pytest.approx(10 / (2 * 3))
    # Data ranks: each rank's share times the ranks, as the other aggregations.
    assert float(aggregate(values, mask, LossScale(4.0, 4.0, ranks=2, response_budget=8))) == pytest.approx(10 / (4 * 8) * 2)


def test_reinforce_plus_plus_baseline_matches_verl():
    rewards = RNG.normal(size=8)
    groups = np.repeat(np.arange(2), 4)
    _, _, _, mask = random_batch()
    mask = np.concatenate([mask, mask[:2]])
    got = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus_baseline")(t(rewards), t(mask), t(groups, "int64")).numpy()
    # verl: r - its group's mean, broadcast, then whitened over the valid tokens (unbiased variance, eps 1e-8).
    centred = np.array([rewards[i] - rewards[groups == groups[i]].mean() for i in range(8)])[:, None] * mask
    valid = centred[mask > 0]
    expected = (centred - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8) * mask
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert ADVANTAGE_ESTIMATORS.traits("reinforce_plus_plus_baseline").group_baseline


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_the_in_reward_kl_takes_any_estimator(estimator):
    logprobs, ref, _, mask = random_batch()
    rewards = RNG.normal(size=B)
    got = kl_shaped_token_rewards(t(rewards), t(mask), t(logprobs), t(ref), 0.1, estimator).numpy()
    d = logprobs - ref
    kl = {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) - 1 + d}[estimator]
    last = (np.arange(R)[None, :] == mask.sum(-1)[:, None] - 1)
    expected = (last * rewards[:, None] - 0.1 * kl) * mask
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, options, aggregation", [
    ("ppo_clip", dict(clip_range_ratio_low=0.2, clip_range_ratio_high=0.28, clip_ratio_c=3.0), "token-mean"),
    ("gspo", dict(clip_range_ratio_low=0.2, clip_range_ratio_high=0.28), "seq-mean-token-mean"),
    ("cispo", dict(clip_range_ratio_low=1.0, clip_range_ratio_high=0.28), "token-mean"),
    ("sapo", dict(sapo_tau_pos=1.0, sapo_tau_neg=1.05), "token-mean"),
    ("gmpo", dict(clip_range_ratio_low=0.4, clip_range_ratio_high=0.4), "seq-mean-token-mean"),
])
@pytest.mark.parametrize("masked", [True, False])
def test_losses_and_gradients_stay_finite_at_any_log_ratio(name, options, aggregation, masked):
    """Log-ratios of +-90 (e^90 is inf in float32), on a masked-out token or a valid one: the loss, its
    gradient and the statistics stay finite (verl and OpenRLHF clamp the log-ratio to +-20 before exp)."""
    logprobs = np.full((2, 3), -1.0, "float32")
    old = logprobs.copy()
    old[0, 2], old[1, 1] = -91.0, 89.0  # log-ratios +90 and -90
    mask = np.ones((2, 3), "float32")
    if masked:
        mask[0, 2] = mask[1, 1] = 0.0
    current = t(logprobs, "float32")
    current.stop_gradient = False
    token_loss, stats = POLICY_LOSSES.get(name)(current, t(old, "float32"), t([[1.0] * 3, [-1.0] * 3], "float32"),
                                               t(mask, "float32"), **options)
    loss = LOSS_AGGREGATIONS.get(aggregation)(token_loss, t(mask, "float32"))
    loss.backward()
    assert np.isfinite(float(loss))
    assert np.isfinite(current.grad.numpy()).all()
    assert all(np.isfinite(float(value)) for value in stats.values())


def test_value_clip_fraction_is_zero_when_nothing_is_clipped():
    """4,096 tokens whose new values lie within the clip range of the old: the clipped term is V itself, so
    the loss is 0.5 (V - G)^2 exactly and no token counts as clipped (old + clip(V - old) rounds away from V
    in float32: it counted 6% of these tokens)."""
    rng = np.random.default_rng(3)
    old = rng.normal(scale=0.1, size=(64, 64)).astype("float32")
    values = (old.astype("float64") + rng.uniform(-0.19, 0.19, size=old.shape)).astype("float32")
    returns = rng.normal(scale=0.1, size=old.shape).astype("float32")
    mask = paddle.ones(old.shape)
    loss, stats = clipped_value_loss(t(values, "float32"), t(old, "float32"), t(returns, "float32"), mask, 0.2)
    assert float(stats["val/clipfrac_avg"]) == 0.0
    np.testing.assert_array_equal(loss.numpy(), 0.5 * ((t(values, "float32") - t(returns, "float32")) ** 2).numpy())


def test_value_clip_counts_and_bounds_what_it_clips():
    # V moved 1.0 from V_old = 0 with c = 0.2: the clipped value is 0.2; G = 1 makes its error the larger.
    loss, stats = clipped_value_loss(t([[1.0, 0.1]], "float32"), t([[0.0, 0.0]], "float32"), t([[1.0, 0.1]], "float32"),
                                     paddle.ones([1, 2]), 0.2)
    np.testing.assert_allclose(loss.numpy(), [[0.5 * 0.8**2, 0.0]], rtol=1e-6)
    assert float(stats["val/clipfrac_avg"]) == pytest.approx(0.5)
