"""Advantage, loss, KL and schedule functions against values computed by hand or with NumPy."""

import math

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, LR_SCHEDULES, POLICY_LOSSES
from paddle_alignment.algos.schedules import build_lr_scheduler
from paddle_alignment.algos.token_stats import entropy_from_logits, gather_logprobs


def t(values, dtype="float32"):
    return paddle.to_tensor(values, dtype=dtype)


def test_grpo_advantages_by_hand():
    # Group 0 rewards [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3); group 5 rewards [2, 4]: mean 3, std sqrt(2).
    rewards = t([1.0, 0.0, 0.0, 2.0, 4.0])
    groups = t([0, 0, 0, 5, 5], "int64")
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    adv = ADVANTAGE_ESTIMATORS.get("grpo")(rewards, mask, groups, epsilon=0.0).numpy()
    s = math.sqrt(1 / 3)
    expected_scalar = [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, -1 / math.sqrt(2), 1 / math.sqrt(2)]
    np.testing.assert_allclose(adv, np.array(expected_scalar)[:, None] * mask.numpy(), rtol=1e-5)


def test_grpo_without_std_normalisation_is_dr_grpo():
    rewards = t([3.0, 1.0, 10.0, 10.0])
    groups = t([0, 0, 1, 1], "int64")
    adv = ADVANTAGE_ESTIMATORS.get("grpo")(rewards, paddle.ones([4, 2]), groups, norm_adv_by_std_in_grpo=False).numpy()
    np.testing.assert_allclose(adv[:, 0], [1.0, -1.0, 0.0, 0.0], atol=1e-6)


def test_grpo_equal_rewards_give_zero_advantage():
    adv = ADVANTAGE_ESTIMATORS.get("grpo")(t([2.0, 2.0, 2.0]), paddle.ones([3, 4]), t([1, 1, 1], "int64")).numpy()
    np.testing.assert_allclose(adv, 0.0, atol=1e-6)


def test_grpo_matches_numpy_on_random_groups():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=24).astype("float32")
    groups = np.repeat(np.arange(6), 4)
    adv = ADVANTAGE_ESTIMATORS.get("grpo")(t(rewards), paddle.ones([24, 1]), t(groups, "int64"), epsilon=1e-6).numpy()[:, 0]
    expected = np.empty(24)
    for g in range(6):
        r = rewards[groups == g]
        expected[groups == g] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-5)


def test_ppo_clip_loss_and_clip_fractions_by_hand():
    # Ratios e^{log diff}: 1.5 (A=+1, clipped high at 1.28), 0.5 (A=-1, clipped low at 0.8), 1.1 (A=+2, inside).
    old = t([[0.0, 0.0, 0.0]])
    new = t([[math.log(1.5), math.log(0.5), math.log(1.1)]])
    adv = t([[1.0, -1.0, 2.0]])
    mask = t([[1.0, 1.0, 1.0]])
    loss, stats = POLICY_LOSSES.get("ppo_clip")(new, old, adv, mask, clip_range_ratio_low=0.2, clip_range_ratio_high=0.28)
    # max(-A r, -A clip(r)): -1.28, max(0.5, 0.8) = 0.8, -2.2
    np.testing.assert_allclose(loss.numpy(), [[-1.28, 0.8, -2.2]], rtol=1e-5)
    assert float(stats["clipfrac_high"]) == pytest.approx(1 / 3)
    assert float(stats["clipfrac_low"]) == pytest.approx(1 / 3)
    log_r = np.log([1.5, 0.5, 1.1])
    assert float(stats["policy/approxkl_avg"]) == pytest.approx(np.mean(np.exp(log_r) - 1 - log_r), rel=1e-5)


def test_ppo_clip_gradient_is_zero_when_clipped():
    new = t([[math.log(1.5), math.log(1.1)]])
    new.stop_gradient = False
    loss, _ = POLICY_LOSSES.get("ppo_clip")(new, t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1.0, 1.0]]), 0.2, 0.2)
    loss.sum().backward()
    # Clipped token: no gradient; unclipped token: d(-A r)/d log p = -A r = -1.1.
    np.testing.assert_allclose(new.grad.numpy(), [[0.0, -1.1]], rtol=1e-5)


def test_kl_estimators_by_hand():
    logp, ref = t([-1.0, -2.0]), t([-1.5, -1.0])
    d = np.array([0.5, -1.0])  # log pi - log pi_ref
    np.testing.assert_allclose(KL_ESTIMATORS.get("k1")(logp, ref).numpy(), d, rtol=1e-6)
    np.testing.assert_allclose(KL_ESTIMATORS.get("k2")(logp, ref).numpy(), 0.5 * d**2, rtol=1e-6)
    np.testing.assert_allclose(KL_ESTIMATORS.get("k3")(logp, ref).numpy(), np.exp(-d) - 1 + d, rtol=1e-6)
    assert float(KL_ESTIMATORS.get("k3")(logp, logp).sum()) == 0.0


def test_k3_stays_finite_where_the_policy_rules_a_token_out():
    logp, ref = t(np.array([[-100.0, -1.0]])), t(np.array([[0.0, -1.0]]))
    masked = KL_ESTIMATORS.get("k3")(logp, ref) * t(np.array([[0.0, 1.0]]))
    assert np.isfinite(masked.numpy()).all() and float(masked.sum()) == 0.0


def test_k3_estimates_true_kl_by_sampling():
    rng = np.random.default_rng(1)
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.3, 0.3, 0.4])
    samples = rng.choice(3, size=200_000, p=p)
    estimate = KL_ESTIMATORS.get("k3")(t(np.log(p[samples])), t(np.log(q[samples]))).numpy().mean()
    assert estimate == pytest.approx(float((p * np.log(p / q)).sum()), rel=0.02)


def test_loss_aggregations_by_hand():
    values = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    assert float(LOSS_AGGREGATIONS.get("token-mean")(values, mask)) == pytest.approx(10 / 4)
    assert float(LOSS_AGGREGATIONS.get("seq-mean-token-mean")(values, mask)) == pytest.approx((2 + 4) / 2)
    assert float(LOSS_AGGREGATIONS.get("seq-mean-token-sum")(values, mask)) == pytest.approx((6 + 4) / 2)


def test_gather_logprobs_and_entropy_match_numpy():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 3, 7)).astype("float32")
    labels = rng.integers(0, 7, size=(2, 3))
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = np.take_along_axis(log_softmax, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(gather_logprobs(t(logits), t(labels, "int64")).numpy(), expected, rtol=1e-5, atol=1e-6)
    entropy = -(np.exp(log_softmax) * log_softmax).sum(-1)
    np.testing.assert_allclose(entropy_from_logits(t(logits)).numpy(), entropy, rtol=1e-5)


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_schedules_warm_up_then_decay_to_min_lr(name):
    lr, min_lr, warmup, total = 1e-3, 1e-4, 4, 20
    schedule = LR_SCHEDULES.get(name)
    assert schedule(0, warmup, total, lr, min_lr) == pytest.approx(lr / 4)
    assert schedule(3, warmup, total, lr, min_lr) == pytest.approx(lr)
    assert schedule(total, warmup, total, lr, min_lr) == pytest.approx(min_lr)
    midpoint = schedule(warmup + (total - warmup) // 2, warmup, total, lr, min_lr)
    assert midpoint == pytest.approx((lr + min_lr) / 2)


def test_lr_scheduler_follows_the_schedule():
    scheduler = build_lr_scheduler("cosine", 1e-3, 1e-4, warmup_steps=2, total_steps=10)
    seen = []
    for _ in range(11):
        seen.append(scheduler.get_lr())
        scheduler.step()
    expected = [LR_SCHEDULES.get("cosine")(s, 2, 10, 1e-3, 1e-4) for s in range(11)]
    np.testing.assert_allclose(seen, expected, rtol=1e-6)


def test_unknown_names_are_rejected_with_choices():
    with pytest.raises(ValueError, match="choose from"):
        ADVANTAGE_ESTIMATORS.get("ppo_magic")


def test_rloo_advantages_by_hand():
    # Group [1, 0, 0]: baselines are the means of the others, 0, 0.5, 0.5; group [2, 4]: 4 and 2.
    rewards = t([1.0, 0.0, 0.0, 2.0, 4.0])
    groups = t([3, 3, 3, 1, 1], "int64")
    adv = ADVANTAGE_ESTIMATORS.get("rloo")(rewards, paddle.ones([5, 2]), groups).numpy()
    np.testing.assert_allclose(adv[:, 0], [1.0, -0.5, -0.5, -2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(adv[:, 1], adv[:, 0])


def test_rloo_matches_a_numpy_leave_one_out_loop():
    rng = np.random.default_rng(4)
    rewards = rng.normal(size=12).astype("float32")
    groups = np.repeat([5, 2, 9], 4)
    adv = ADVANTAGE_ESTIMATORS.get("rloo")(t(rewards), paddle.ones([12, 1]), t(groups, "int64")).numpy()[:, 0]
    expected = [rewards[i] - np.mean([rewards[j] for j in range(12) if groups[j] == groups[i] and j != i]) for i in range(12)]
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


def test_gspo_uses_one_clipped_ratio_per_sequence():
    # Sequence 0: token log-ratios 0.2 and 0.0 over 2 valid tokens -> ratio e^0.1 (inside the clip);
    # sequence 1: log-ratios 0.5, 0.5, 0.5 -> e^0.5 = 1.65, clipped at 1.3 for a positive advantage.
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    new = t([[0.2, 0.0, 9.0], [0.5, 0.5, 0.5]])
    new.stop_gradient = False
    mask = t([[1, 1, 0], [1, 1, 1]])
    adv = t([[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
    loss, stats = POLICY_LOSSES.get("gspo")(new, old, adv, mask, clip_range_ratio_low=0.2, clip_range_ratio_high=0.3)
    s0 = math.exp(0.1)
    np.testing.assert_allclose(loss.numpy()[0, :2], [s0, s0], rtol=1e-5)
    np.testing.assert_allclose(loss.numpy()[1], [-2.6, -2.6, -2.6], rtol=1e-5)
    assert float(stats["clipfrac_high"]) == pytest.approx(3 / 5)
    (loss * mask).sum().backward()
    # Unclipped sequence: d(-A * s)/d log pi_t = -A * s for each token (the ratio is per sequence, the
    # gradient per token); clipped sequence: no gradient.
    np.testing.assert_allclose(new.grad.numpy()[0, :2], [s0, s0], rtol=1e-5)
    np.testing.assert_allclose(new.grad.numpy()[1], [0.0, 0.0, 0.0], atol=1e-7)


def test_call_with_options_passes_only_named_settings():
    from paddle_alignment.algos.registry import call_with_options

    rewards, mask, groups = t([1.0, 3.0]), paddle.ones([2, 1]), t([0, 0], "int64")
    grpo = call_with_options(ADVANTAGE_ESTIMATORS.get("grpo"), rewards, mask, groups, norm_adv_by_std_in_grpo=False)
    rloo = call_with_options(ADVANTAGE_ESTIMATORS.get("rloo"), rewards, mask, groups, norm_adv_by_std_in_grpo=False)
    np.testing.assert_allclose(grpo.numpy()[:, 0], [-1.0, 1.0])
    np.testing.assert_allclose(rloo.numpy()[:, 0], [-2.0, 2.0])


def test_discounted_returns_match_a_numpy_loop():
    from paddle_alignment.algos.advantages import discounted_returns

    rng = np.random.default_rng(5)
    rewards = rng.normal(size=(3, 5)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], "float32")
    got = discounted_returns(t(rewards * mask), t(mask), gamma=0.9).numpy()
    expected = np.zeros_like(rewards)
    for b in range(3):
        for s in range(5):
            expected[b, s] = sum(0.9 ** (k - s) * rewards[b, k] * mask[b, k] for k in range(s, 5)) * mask[b, s]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_reinforce_plus_plus_by_hand():
    # Two responses of lengths 2 and 1, scores 1 and 0, gamma 1, KL penalty 0.5 * k1 per token.
    # Token rewards: [-0.5*0.2, 1 - 0.5*0.4] = [-0.1, 0.8] and [0 - 0.5*(-0.2)] = [0.1];
    # returns: [0.7, 0.8] and [0.1]; whitened over the three valid tokens.
    rewards = t([1.0, 0.0])
    mask = t([[1, 1], [1, 0]])
    logprobs, ref_logprobs = t([[-1.0, -0.6], [-1.2, 8.0]]), t([[-1.2, -1.0], [-1.0, -1.0]])  # k1 = [[0.2, 0.4], [-0.2, 9]]
    adv = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(rewards, mask, logprobs, ref_logprobs, kl_coeff=0.5).numpy()
    returns = np.array([0.7, 0.8, 0.1])
    # verl's masked_whiten: unbiased variance, eps 1e-8.
    white = (returns - returns.mean()) / np.sqrt(returns.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(adv, [[white[0], white[1]], [white[2], 0.0]], rtol=1e-5, atol=1e-5)


def test_overlong_penalty_by_hand():
    from paddle_alignment.algos.reward_shaping import overlong_penalty

    # max_dec_len 10, buffer 4: free up to 6 tokens, then -0.25 per token down to -1 at 10.
    lengths = t([3.0, 6.0, 7.0, 9.0, 10.0])
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4, 1.0).numpy(), [0, 0, -0.25, -0.75, -1.0], atol=1e-7)
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4, 0.5).numpy()[-1], -0.5)
