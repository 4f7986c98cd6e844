"""Per-token estimators of KL(pi || pi_ref) from log-probabilities of tokens sampled from pi (Schulman's k1/k2/k3)."""

import paddle

from llm.alignment.ppo.algos.registry import KL_ESTIMATORS

MAX_K3_LOG_RATIO = 20.0


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
    """pi_ref / pi - 1 - log(pi_ref / pi): unbiased and non-negative (GRPO's KL loss).

    The exponent is capped at 20 so that a token pi all but rules out (log-prob below about -88, e.g. a
    padding position a mask drops afterwards) gives a large finite value rather than inf, which a zero
    mask would turn into NaN."""
    log_ratio = ref_logprobs - logprobs
    return paddle.exp(log_ratio.clip(max=MAX_K3_LOG_RATIO)) - 1.0 - log_ratio
