"""Per-token estimators of KL(pi || pi_ref) from log-probabilities of tokens sampled from pi (Schulman's k1/k2/k3)."""

import paddle

from paddle_alignment.algos.registry import KL_ESTIMATORS

# verl's and OpenRLHF's bounds: a log-ratio to +-20 before exp (k3 here, the policy losses' importance ratio),
# k3's estimate to +-10. A token the policy all but rules out then costs at most 10 and a bounded gradient.
MAX_LOG_RATIO = 20.0
MAX_K3 = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs, ref_logprobs):
    """log(pi / pi_ref): unbiased, high variance, can be negative."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs, ref_logprobs):
    """0.5 * log(pi / pi_ref)^2: biased, low variance, non-negative."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs, ref_logprobs):
    """pi_ref / pi - 1 - log(pi_ref / pi): unbiased and non-negative (GRPO's KL loss), with verl's clamps:
    the log-ratio to [-20, 20] (no inf from exp, which a zero mask would turn into NaN) and the estimate
    to [-10, 10]."""
    log_ratio = (ref_logprobs - logprobs).clip(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return (paddle.exp(log_ratio) - 1.0 - log_ratio).clip(-MAX_K3, MAX_K3)
