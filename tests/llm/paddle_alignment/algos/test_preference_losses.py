"""Every preference loss against a NumPy port of TRL's (DPOTrainer, CPOTrainer, KTOTrainer) or PaddleNLP's
(DPOCriterion, KTOCriterion) formula: values, and gradients (the NumPy port's by central differences) to 1e-6."""

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import PREFERENCE_LOSSES, UNPAIRED_PREFERENCE_LOSSES
from paddle_alignment.algos.preference import chosen_nll, kl_baseline
from paddle_alignment.algos.registry import call_with_options

BETA, SMOOTHING, GAMMA, LAMBDA = 0.3, 0.2, 0.5, 50.0


def logsig(x):
    return -np.logaddexp(0, -x)


def sig(x):
    return 1 / (1 + np.exp(-x))


def trl_scores(c, r, rc, rr):
    return c - rc, r - rr


# NumPy ports: (policy chosen, policy rejected, reference chosen, reference rejected) -> per-pair losses.
def np_sigmoid(c, r, rc, rr):  # PaddleNLP's and TRL's sigmoid with label smoothing
    logits = (c - r) - (rc - rr)
    return -logsig(BETA * logits) * (1 - SMOOTHING) - logsig(-BETA * logits) * SMOOTHING


def np_hinge(c, r, rc, rr):
    return np.maximum(0, 1 - BETA * ((c - r) - (rc - rr)))


def np_ipo(c, r, rc, rr):  # inputs already mean token log-probs (length_normalized)
    return ((c - r) - (rc - rr) - 1 / (2 * BETA)) ** 2


def np_robust(c, r, rc, rr):
    delta = (c - rc) - (r - rr)
    return (-(1 - SMOOTHING) * logsig(BETA * delta) + SMOOTHING * logsig(-BETA * delta)) / (1 - 2 * SMOOTHING)


def np_exo_pair(c, r, rc, rr):
    delta = BETA * ((c - rc) - (r - rr))
    return sig(delta) * (logsig(delta) - np.log1p(-SMOOTHING)) + sig(-delta) * (logsig(-delta) - np.log(SMOOTHING))


def np_dpop(c, r, rc, rr):  # PaddleNLP
    return -logsig(BETA * ((c - r) - (rc - rr))) + LAMBDA * np.maximum(rc - c, 0)


def np_kto_pair(c, r, rc, rr):  # PaddleNLP: concat of the two halves, here as each pair's mean of its two terms
    chosen_kl, rejected_kl = max((c - rc).mean(), 0), max((r - rr).mean(), 0)
    return ((1 - sig(BETA * ((c - rc) - rejected_kl))) + (1 - sig(BETA * (chosen_kl - (r - rr))))) / 2


def np_sppo_hard(c, r, rc, rr):
    a, b = trl_scores(c, r, rc, rr)
    return (a - 0.5 / BETA) ** 2 + (b + 0.5 / BETA) ** 2


def np_nca_pair(c, r, rc, rr):
    a, b = trl_scores(c, r, rc, rr)
    return -logsig(BETA * a) - 0.5 * logsig(-BETA * a) - 0.5 * logsig(-BETA * b)


def np_bco_pair(c, r, rc, rr):
    a, b = trl_scores(c, r, rc, rr)
    return -logsig(BETA * a) - logsig(-BETA * b)


def np_apo_zero(c, r, rc, rr):
    a, b = trl_scores(c, r, rc, rr)
    return 1 - sig(BETA * a) + sig(BETA * b)


def np_apo_down(c, r, rc, rr):
    a, b = trl_scores(c, r, rc, rr)
    return sig(BETA * a) + 1 - sig(BETA * (a - b))


def np_aot(c, r, rc, rr):
    delta = np.sort(c - r) - np.sort(rc - rr)
    return -logsig(BETA * delta) * (1 - SMOOTHING) - logsig(-BETA * delta) * SMOOTHING


def np_aot_pair(c, r, rc, rr):
    delta = np.sort(c - rc) - np.sort(r - rr)
    return -logsig(BETA * delta) * (1 - SMOOTHING) - logsig(-BETA * delta) * SMOOTHING


def np_simpo(c, r, rc, rr):  # TRL's CPOTrainer and PaddleNLP (reference-free)
    logits = (c - r) - GAMMA / BETA
    return -logsig(BETA * logits) * (1 - SMOOTHING) - logsig(-BETA * logits) * SMOOTHING


def np_or(c, r, rc, rr):  # PaddleNLP's `or`, TRL's ORPO log-odds
    log_odds = (c - r) - (np.log1p(-np.exp(c)) - np.log1p(-np.exp(r)))
    return -logsig(log_odds)


PORTS = {
    "sigmoid": np_sigmoid, "hinge": np_hinge, "ipo": np_ipo, "robust": np_robust, "exo_pair": np_exo_pair,
    "dpop": np_dpop, "kto_pair": np_kto_pair, "sppo_hard": np_sppo_hard, "nca_pair": np_nca_pair,
    "bco_pair": np_bco_pair, "apo_zero": np_apo_zero, "apo_down": np_apo_down, "aot": np_aot, "aot_pair": np_aot_pair,
    "simpo": np_simpo, "or": np_or,
}
OPTIONS = {"beta": BETA, "label_smoothing": SMOOTHING, "simpo_gamma": GAMMA, "dpop_lambda": LAMBDA}


def log_probs(length_normalized, seed=0):
    """Four [6] arrays: sums of token log-probs, or (length-normalised) means in (-3, -0.01)."""
    rng = np.random.default_rng(seed)
    if length_normalized:
        return [rng.uniform(-3, -0.01, 6) for _ in range(4)]
    return [rng.uniform(-40, -1, 6) for _ in range(4)]


def numeric_gradient(fn, arrays, index, h=1e-6):
    grad = np.zeros_like(arrays[index])
    for i in range(grad.size):
        up = [a.copy() for a in arrays]
        down = [a.copy() for a in arrays]
        up[index][i] += h
        down[index][i] -= h
        grad[i] = (fn(*up).sum() - fn(*down).sum()) / (2 * h)
    return grad


def test_every_registered_pair_loss_has_a_numpy_port():
    assert sorted(PORTS) == PREFERENCE_LOSSES.names()


@pytest.mark.parametrize("name", sorted(PORTS))
def test_pair_loss_equals_its_numpy_port_in_value_and_gradient(name):
    arrays = log_probs(PREFERENCE_LOSSES.traits(name).length_normalized)
    tensors = [paddle.to_tensor(a, dtype="float64", stop_gradient=False) for a in arrays]
    loss = call_with_options(PREFERENCE_LOSSES.get(name), *tensors, **OPTIONS)
    np.testing.assert_allclose(loss.numpy(), PORTS[name](*arrays), rtol=1e-6, atol=1e-6)
    loss.sum().backward()
    uses_reference = PREFERENCE_LOSSES.traits(name).reference
    for index, tensor in enumerate(tensors[: 4 if uses_reference else 2]):
        np.testing.assert_allclose(tensor.grad.numpy(), numeric_gradient(PORTS[name], arrays, index), rtol=1e-6, atol=1e-6)


def test_reference_free_losses_ignore_the_reference():
    c, r, rc, rr = (paddle.to_tensor(a) for a in log_probs(True))
    for name in PREFERENCE_LOSSES.names():
        if not PREFERENCE_LOSSES.traits(name).reference:
            fn = PREFERENCE_LOSSES.get(name)
            np.testing.assert_array_equal(call_with_options(fn, c, r, rc, rr, **OPTIONS).numpy(),
                                          call_with_options(fn, c, r, rc * 0, rr * 0, **OPTIONS).numpy())


def test_odds_ratio_loss_is_accurate_where_a_mean_log_prob_is_near_zero():
    from paddle_alignment.algos.preference import log1mexp

    x = np.array([-1e-7, -1e-3, -0.69, -0.7, -5.0, -40.0])
    np.testing.assert_allclose(log1mexp(paddle.to_tensor(x, dtype="float32")).numpy(), np.log(-np.expm1(x)), rtol=1e-5, atol=1e-12)


def test_chosen_nll_is_paddlenlps_sft_loss():
    sums, tokens = paddle.to_tensor([-3.0, -5.0]), paddle.to_tensor([2.0, 6.0])
    np.testing.assert_allclose(float(chosen_nll(sums, tokens)), 8.0 / 8.0)


# KTO: (desirable, reference desirable, undesirable, reference undesirable, kl) -> losses.
def np_kto(d, rd, u, ru, kl, dw=1.5, uw=0.7):  # TRL's KTOTrainer, PaddleNLP's KTOCriterion
    return np.concatenate([dw * (1 - sig(BETA * ((d - rd) - kl))), uw * (1 - sig(BETA * (kl - (u - ru))))])


def np_apo_zero_unpaired(d, rd, u, ru, kl, dw=1.5, uw=0.7):  # TRL's KTOTrainer
    return np.concatenate([dw * (1 - sig(BETA * (d - rd))), uw * sig(BETA * (u - ru))])


@pytest.mark.parametrize("name, port", [("kto", np_kto), ("apo_zero_unpaired", np_apo_zero_unpaired)])
def test_unpaired_loss_equals_its_numpy_port_in_value_and_gradient(name, port):
    rng = np.random.default_rng(1)
    arrays = [rng.uniform(-30, -1, 4), rng.uniform(-30, -1, 4), rng.uniform(-30, -1, 3), rng.uniform(-30, -1, 3)]
    kl = 0.4
    tensors = [paddle.to_tensor(a, dtype="float64", stop_gradient=False) for a in arrays]
    loss = UNPAIRED_PREFERENCE_LOSSES.get(name)(*tensors, paddle.to_tensor(kl, dtype="float64"), beta=BETA,
                                                desirable_weight=1.5, undesirable_weight=0.7)
    np.testing.assert_allclose(loss.numpy(), port(*arrays, kl), rtol=1e-6, atol=1e-6)
    loss.sum().backward()
    for index, tensor in enumerate(tensors):
        expected = numeric_gradient(lambda *a: port(*a, kl), arrays, index)
        np.testing.assert_allclose(tensor.grad.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_kl_baseline_is_the_clipped_mean_log_ratio_over_ranks():
    policy, reference = paddle.to_tensor([-3.0, -5.0]), paddle.to_tensor([-4.0, -4.5])
    np.testing.assert_allclose(float(kl_baseline(policy, reference)), 0.25)
    np.testing.assert_allclose(float(kl_baseline(reference, policy)), 0.0)
    np.testing.assert_allclose(float(kl_baseline(policy, reference, mean_over_ranks=lambda kl: (kl + 1.75) / 2)), 1.0)
