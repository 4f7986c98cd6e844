"""The rollout corrections (algos/rollout_correction.py) and the mismatch metrics, each against a NumPy port
of its published formula (TRL's importance-sampling modes, verl's rollout correction, IcePop), and the policy
objective that applies them."""

from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import ROLLOUT_CORRECTIONS
from paddle_alignment.algos.rollout_correction import mismatch_metrics, turn_mismatch_metrics
from paddle_alignment.models.ppo_model_utils import PolicyObjective

RNG = np.random.default_rng(11)
B, R = 8, 7
UPPER, LOWER = 2.0, 0.5


def t(values):
    return paddle.to_tensor(np.asarray(values), dtype="float64")


def gap_batch(scale=0.6):
    """Log-ratios old - rollout of a few tenths (some beyond the bounds) and a ragged mask."""
    log_ratio = RNG.normal(scale=scale, size=(B, R))
    lengths = RNG.integers(1, R + 1, size=B)
    mask = (np.arange(R)[None, :] < lengths[:, None]).astype("float64")
    return log_ratio, mask


def numpy_sequence_ratio(log_ratio, mask):
    return np.exp((log_ratio * mask).sum(-1, keepdims=True))


def numpy_token_tis(log_ratio, mask):
    return np.minimum(np.exp(log_ratio), UPPER) * mask


def numpy_sequence_tis(log_ratio, mask):
    return np.minimum(numpy_sequence_ratio(log_ratio, mask), UPPER) * mask


def numpy_sequence_mis(log_ratio, mask):
    ratio = numpy_sequence_ratio(log_ratio, mask)
    return np.where((ratio >= LOWER) & (ratio <= UPPER), ratio, 0.0) * mask


def numpy_geometric_mask(log_ratio, mask):
    geometric = np.exp((log_ratio * mask).sum(-1, keepdims=True) / mask.sum(-1, keepdims=True))
    return ((geometric >= LOWER) & (geometric <= UPPER)) * mask


def numpy_icepop(log_ratio, mask):
    ratio = np.exp(log_ratio)
    return np.where((ratio >= LOWER) & (ratio <= UPPER), ratio, 0.0) * mask


PORTS = {
    "token_tis": numpy_token_tis,
    "sequence_tis": numpy_sequence_tis,
    "sequence_mis": numpy_sequence_mis,
    "geometric_mask": numpy_geometric_mask,
    "icepop": numpy_icepop,
}


def test_every_registered_correction_has_a_port():
    assert sorted(PORTS) == ROLLOUT_CORRECTIONS.names()


@pytest.mark.parametrize("name", sorted(PORTS))
def test_each_correction_matches_its_numpy_port(name):
    # geometric_mask compares a per-token mean with its bounds: a wider spread of sequences reaches them.
    log_ratio, mask = gap_batch(scale=1.5 if name == "geometric_mask" else 0.6)
    weights, stats = ROLLOUT_CORRECTIONS.get(name)(t(log_ratio), t(mask), UPPER, LOWER)
    expected = PORTS[name](log_ratio, mask)
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-12, atol=1e-15)
    # Every correction reaches its bound here, and leaves padding at weight 0.
    assert 0 < (expected[mask > 0] != np.exp(log_ratio)[mask > 0]).sum()
    assert not weights.numpy()[mask == 0].any()
    if "rollout_corr/masked_token_frac" in stats:
        zeroed = ((expected == 0) * mask).sum() / mask.sum()
        assert float(stats["rollout_corr/masked_token_frac"]) == pytest.approx(zeroed) and zeroed > 0
    if "rollout_corr/truncated_token_frac" in stats:
        truncated = ((np.exp(log_ratio) > UPPER) * mask).sum() / mask.sum()
        assert float(stats["rollout_corr/truncated_token_frac"]) == pytest.approx(truncated) and truncated > 0


@pytest.mark.parametrize("name", sorted(PORTS))
def test_corrections_stay_finite_at_any_log_ratio(name):
    log_ratio, mask = gap_batch()
    log_ratio[0, 0], log_ratio[1, -1] = 90.0, -90.0  # one real token, one perhaps padding
    weights, _ = ROLLOUT_CORRECTIONS.get(name)(t(log_ratio), t(mask), UPPER, LOWER)
    assert np.isfinite(weights.numpy()).all()


def test_mismatch_metrics_match_their_formulas_and_read_zero_without_a_gap():
    rollout = RNG.uniform(-4.0, -0.1, size=(B, R))
    log_ratio, mask = gap_batch(scale=0.2)
    metrics = {k: float(v) for k, v in mismatch_metrics(t(rollout + log_ratio), t(rollout), t(mask)).items()}
    ratio = np.exp(log_ratio)
    real = mask > 0
    assert metrics["rollout_corr/logprob_diff_mean"] == pytest.approx(np.abs(log_ratio)[real].mean())
    assert metrics["rollout_corr/logprob_diff_max"] == pytest.approx(np.abs(log_ratio)[real].max())
    assert metrics["rollout_corr/is_ratio_mean"] == pytest.approx(ratio[real].mean())
    # k3 estimate of KL(pi_rollout || pi_old) from tokens drawn from the rollout policy.
    assert metrics["rollout_corr/k3_kl"] == pytest.approx((ratio - 1 - log_ratio)[real].mean())
    same = mismatch_metrics(t(rollout), t(rollout), t(mask))
    assert float(same["rollout_corr/logprob_diff_max"]) == 0 and float(same["rollout_corr/is_ratio_mean"]) == 1


def test_the_mismatch_of_each_turn_is_a_sum_and_count_over_that_turns_sampled_tokens():
    rollout = RNG.uniform(-4.0, -0.1, size=(B, R))
    log_ratio, mask = gap_batch(scale=0.2)
    turn_ids = RNG.integers(0, 3, size=(B, R)) * (mask > 0)  # turn 0: observations and padding
    mask = mask * (turn_ids > 0)
    metrics = turn_mismatch_metrics(t(rollout + log_ratio), t(rollout), t(mask), paddle.to_tensor(turn_ids), 3)
    assert sorted(metrics) == [f"rollout_corr/logprob_diff_mean/turn_{k}" for k in (1, 2, 3)]
    for turn in (1, 2):
        total, count = (float(v) for v in metrics[f"rollout_corr/logprob_diff_mean/turn_{turn}"])
        chosen = (turn_ids == turn) & (mask > 0)
        assert count == chosen.sum() and total == pytest.approx(np.abs(log_ratio)[chosen].sum(), rel=1e-5)
    assert [float(v) for v in metrics["rollout_corr/logprob_diff_mean/turn_3"]] == [0.0, 0.0]  # no token: no mean


def objective(correction):
    args = SimpleNamespace(
        policy_loss="ppo_clip", kl_estimator="k3", loss_agg_mode="token-mean", kl_loss_coeff=0.0, entropy_coeff=0.0,
        clip_range_ratio_low=0.2, clip_range_ratio_high=0.2, clip_ratio_c=3.0, temperature=1.0, pg_loss_coeff=1.0,
        sapo_tau_pos=1.0, sapo_tau_neg=1.05, max_dec_len=R, rollout_correction=correction,
        rollout_is_threshold=UPPER, rollout_is_threshold_lower=LOWER, max_turns=1, distill_coeff=0.0, distill_loss="reverse_kl",
        distill_beta=0.5,
    )
    return PolicyObjective.from_args(args)


def test_the_objective_weights_each_tokens_policy_loss_and_keeps_its_gradient():
    """On-policy (old = the detached current log-probs) the PPO token loss is -A; with token TIS it is
    -w A, w = min(pi_old / pi_rollout, cap), and its gradient -w A / tokens."""
    log_ratio, mask = gap_batch()
    logprobs = RNG.uniform(-3.0, -0.1, size=(B, R))
    advantages = np.repeat(RNG.normal(size=(B, 1)), R, axis=1)
    rollout = logprobs - log_ratio
    results = {}
    for correction in ("", "token_tis"):
        current = t(logprobs)
        current.stop_gradient = False
        loss, stats = objective(correction).loss(current, t(np.zeros_like(logprobs)), None, None, t(advantages), t(mask),
                                                 rollout_logprobs=t(rollout))
        loss.backward()
        results[correction] = float(loss), current.grad.numpy(), stats
    weights = numpy_token_tis(log_ratio, mask)
    assert results["token_tis"][0] == pytest.approx((-weights * advantages * mask).sum() / mask.sum(), rel=1e-12)
    np.testing.assert_allclose(results["token_tis"][1], -weights * advantages * mask / mask.sum(), rtol=1e-12, atol=1e-15)
    assert results[""][0] == pytest.approx((-advantages * mask).sum() / mask.sum(), rel=1e-12)
    assert float(results["token_tis"][2]["rollout_corr/weight_mean"]) == pytest.approx(weights[mask > 0].mean())
    # Metrics with or without a correction; its own statistics only with it.
    assert "rollout_corr/k3_kl" in results[""][2] and "rollout_corr/weight_mean" not in results[""][2]
