"""Rollout correction: the sampler and the trainer are two computations of one policy.

The fast decode loop draws each token with its own kernels and batching and records the log-prob it drew it
with (`rollout_logprobs`); the trainer's forward gives the same policy's log-probs again (`old`: the
recomputed old log-probs, or the detached current ones on-policy). They differ a little in float32 on CPU
and much more in bfloat16 on GPUs, so the samples are slightly off-policy for the trainer. Each correction
here turns the log-ratio old - rollout [B, R] of the response tokens into per-token weights of the policy
loss (detached): importance weights that are truncated (TIS), or kept only inside bounds and zero outside
(masked IS, IcePop). A zeroed token contributes nothing; the loss normaliser still counts it, as TRL's
masked importance sampling does. `mismatch_metrics` measures the gap itself, every step, correction or not.

Thresholds: `upper` (rollout_is_threshold) and `lower` (rollout_is_threshold_lower, 1 / upper by default).
"""

import paddle

from paddle_alignment.algos.losses import bounded_ratio, k3_of_ratio
from paddle_alignment.algos.masked import masked_mean
from paddle_alignment.algos.registry import ROLLOUT_CORRECTIONS


def sequence_log_ratio(log_ratio, mask):
    """The summed log-ratio of each sequence's response tokens [B, 1]: log of the sequence's ratio."""
    return (log_ratio * mask).sum(axis=-1, keepdim=True)


def inside(ratio, lower, upper):
    return ((ratio >= lower) & (ratio <= upper)).astype(ratio.dtype)


def zeroed_fraction(weights, mask):
    """The fraction of response tokens a correction gives weight 0 (they no longer count in the loss)."""
    return masked_mean((weights == 0).astype(mask.dtype), mask)


@ROLLOUT_CORRECTIONS.register("token_tis")
def token_tis(log_ratio, mask, upper, lower):
    """Truncated importance sampling per token: min(pi_old / pi_rollout, upper) (verl's token-level
    `rollout_is`, TRL's `token_truncate`)."""
    ratio = bounded_ratio(log_ratio)
    weights = paddle.minimum(ratio, paddle.full_like(ratio, upper)) * mask
    return weights, {"rollout_corr/truncated_token_frac": masked_mean((ratio > upper).astype(mask.dtype), mask)}


@ROLLOUT_CORRECTIONS.register("sequence_tis", level="sequence")
def sequence_tis(log_ratio, mask, upper, lower):
    """Truncated importance sampling per sequence: min(prod_t pi_old / pi_rollout, upper) on each of its
    tokens (verl's sequence-level `rollout_is`, TRL's `sequence_truncate`)."""
    ratio = bounded_ratio(sequence_log_ratio(log_ratio, mask))
    weights = paddle.minimum(ratio, paddle.full_like(ratio, upper)) * mask
    return weights, {"rollout_corr/truncated_seq_frac": (ratio > upper).astype(mask.dtype).mean()}


@ROLLOUT_CORRECTIONS.register("sequence_mis", level="sequence")
def sequence_mis(log_ratio, mask, upper, lower):
    """Masked importance sampling per sequence: the sequence's ratio prod_t pi_old / pi_rollout on each of its
    tokens where it lies in [lower, upper], 0 on the whole sequence where not (TRL's `sequence_mask`, with
    verl's lower bound)."""
    ratio = bounded_ratio(sequence_log_ratio(log_ratio, mask))
    kept = inside(ratio, lower, upper)
    weights = ratio * kept * mask
    return weights, {"rollout_corr/masked_seq_frac": 1.0 - kept.mean(), "rollout_corr/masked_token_frac": zeroed_fraction(weights, mask)}


@ROLLOUT_CORRECTIONS.register("geometric_mask", level="sequence")
def geometric_mask(log_ratio, mask, upper, lower):
    """Sequence rejection by the geometric mean of its token ratios, exp(mean_t log pi_old / pi_rollout):
    weight 1 on the sequence's tokens where it lies in [lower, upper], 0 where not (verl's geometric
    `rollout_rs`; bounds such as 1.001 suit it, a mean over tokens being close to 1)."""
    tokens = mask.sum(axis=-1, keepdim=True).clip(min=1.0)
    geometric = bounded_ratio(sequence_log_ratio(log_ratio, mask) / tokens)
    kept = inside(geometric, lower, upper)
    weights = kept * mask
    return weights, {"rollout_corr/masked_seq_frac": 1.0 - kept.mean(), "rollout_corr/masked_token_frac": zeroed_fraction(weights, mask)}


@ROLLOUT_CORRECTIONS.register("icepop")
def icepop(log_ratio, mask, upper, lower):
    """IcePop: the token's ratio pi_old / pi_rollout where it lies in [lower, upper], 0 where not (TRL's
    `token_mask`; the IcePop paper's bounds are 0.5 and 2)."""
    ratio = bounded_ratio(log_ratio)
    weights = ratio * inside(ratio, lower, upper) * mask
    return weights, {"rollout_corr/masked_token_frac": zeroed_fraction(weights, mask)}


def mismatch_metrics(old_logprobs, rollout_logprobs, mask):
    """How far the trainer's log-probs of the sampled tokens are from the sampler's, over response tokens:
    mean and max |old - rollout|, the mean importance ratio pi_old / pi_rollout, and the k3 estimate of
    KL(pi_rollout || pi_old) (the tokens were drawn from the rollout policy)."""
    log_ratio = old_logprobs - rollout_logprobs
    difference = log_ratio.abs() * mask
    ratio = bounded_ratio(log_ratio)
    return {
        "rollout_corr/logprob_diff_mean": masked_mean(difference, mask),
        "rollout_corr/logprob_diff_max": difference.max(),
        "rollout_corr/is_ratio_mean": masked_mean(ratio, mask),
        "rollout_corr/k3_kl": masked_mean(k3_of_ratio(ratio, log_ratio), mask),
    }


def turn_mismatch_metrics(old_logprobs, rollout_logprobs, mask, turn_ids, turns):
    """Multi-turn: the mean |old - rollout| over the sampled tokens of each turn k = 1..`turns` (`turn_ids`: each
    token's turn, 0 on observations), as (sum, count) pairs, so that means over micro-batches and ranks weigh
    every token alike (a micro-batch may hold no token of a late turn)."""
    difference = (old_logprobs - rollout_logprobs).abs() * mask
    metrics = {}
    for turn in range(1, turns + 1):
        in_turn = (turn_ids == turn).astype(mask.dtype) * mask
        metrics[f"rollout_corr/logprob_diff_mean/turn_{turn}"] = ((difference * in_turn).sum(), in_turn.sum())
    return metrics
