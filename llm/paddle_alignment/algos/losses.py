"""Token-level losses and their aggregation over the response mask."""

from dataclasses import dataclass

import paddle

from paddle_alignment.algos.masked import masked_mean, masked_sum
from paddle_alignment.algos.registry import LOSS_AGGREGATIONS, POLICY_LOSSES


@dataclass(frozen=True)
class LossScale:
    """What one optimizer step's loss is averaged over: its valid response `tokens` and its `sequences`,
    counted over every micro-batch of the step (gradient accumulation) and every data-parallel rank, and
    the number of those `ranks` (data parallel averages their gradients, so each rank's part of the sum
    is multiplied back by it). Each micro-batch's loss is then its share of the step's mean, and the
    accumulated, averaged gradient is that of the mean over the whole step (verl's global token mean,
    TRL's `dapo` normaliser)."""

    tokens: float
    sequences: float
    ranks: int = 1

    @classmethod
    def of(cls, mask):
        """The scale of a batch that is a whole step on its own (one micro-batch, one rank)."""
        return cls(mask.astype("float32").sum().clip(min=1.0), mask.shape[0])


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(values, mask, scale=None):
    """Mean over every valid token of the step: long responses weigh more (DAPO's choice)."""
    scale = scale or LossScale.of(mask)
    return masked_sum(values, mask) / scale.tokens * scale.ranks


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(values, mask, scale=None):
    """Mean over tokens inside each response, then over the step's responses: every response weighs the
    same (GRPO paper)."""
    scale = scale or LossScale.of(mask)
    return masked_mean(values, mask, axis=-1).sum() / scale.sequences * scale.ranks


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(values, mask, scale=None):
    """Sum over tokens inside each response, then mean over the step's responses (Dr.GRPO, up to a constant)."""
    scale = scale or LossScale.of(mask)
    return masked_sum(values, mask, axis=-1).sum() / scale.sequences * scale.ranks


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, clip_ratio_c=0.0):
    """PPO clipped surrogate with separate bounds: ratio is clipped to [1 - clip_low, 1 + clip_high]; with
    `clip_ratio_c` > 1, dual-clip PPO caps the loss of negative-advantage tokens at -A * clip_ratio_c
    (verl's `clip_ratio_c`), so one very unlikely token cannot dominate the step.

    Returns the per-token loss [B, R] and a dict of scalar statistics over valid tokens:
    `clipfrac_low` (negative advantage, ratio below the low bound), `clipfrac_high` (positive
    advantage, ratio above the high bound), their sum `policy/clipfrac_avg`, `clipfrac_dual` (tokens
    the dual clip caps), `policy/approxkl_avg` (k3 estimate of KL(old || new)) and the ratio's mean and
    variance `val/ratio`, `val/ratio_var` (TRL's names).
    """
    return clipped_surrogate(logprobs - old_logprobs, advantages, mask, clip_low, clip_high, clip_ratio_c)


def clipped_surrogate(log_ratio, advantages, mask, clip_low, clip_high, clip_ratio_c=0.0):
    """max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) per token with r = exp(log_ratio), capped at
    -A * clip_ratio_c where A < 0 when clip_ratio_c is set, and its statistics."""
    ratio = paddle.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * paddle.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = paddle.maximum(unclipped, clipped)
    dual = paddle.zeros_like(loss, dtype="bool")
    if clip_ratio_c:
        cap = -advantages * clip_ratio_c
        dual = (advantages < 0) & (loss > cap)
        loss = paddle.where(dual, cap, loss)
    with paddle.no_grad():
        dtype = log_ratio.dtype
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).astype(dtype)
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).astype(dtype)
        ratio_mean = masked_mean(ratio, mask)
        stats = {
            "clipfrac_low": masked_mean(low, mask),
            "clipfrac_high": masked_mean(high, mask),
            "policy/clipfrac_avg": masked_mean(low + high, mask),
            "clipfrac_dual": masked_mean(dual.astype(dtype), mask),
            "policy/approxkl_avg": masked_mean(ratio - 1.0 - log_ratio, mask),
            "val/ratio": ratio_mean,
            "val/ratio_var": masked_mean((ratio - ratio_mean) ** 2, mask),
        }
    return loss, stats


def clipped_value_loss(values, old_values, returns, mask, clip_range_value):
    """PPO's value loss 0.5 * max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2) per token [B, R], and
    `val/clipfrac_avg`: the share of valid tokens where the clipped term is the larger."""
    clipped = old_values + paddle.clip(values - old_values, -clip_range_value, clip_range_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped - returns) ** 2
    loss = 0.5 * paddle.maximum(unclipped_error, clipped_error)
    with paddle.no_grad():
        clipfrac = masked_mean((clipped_error > unclipped_error).astype(values.dtype), mask)
    return loss, {"val/clipfrac_avg": clipfrac}


@POLICY_LOSSES.register("gspo", loss_agg_mode="seq-mean-token-mean")
def gspo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    """GSPO: one importance ratio per sequence, exp(mean over its tokens of log pi - log pi_old), clipped
    to [1 - clip_low, 1 + clip_high]. Written per token as sg[s] * pi / sg[pi], so every token of a
    response gets the sequence's ratio in value and its own log-prob in the gradient.

    The objective is a mean over sequences, so it is aggregated with seq-mean-token-mean whatever
    `loss_agg_mode` says (the GSPO paper; verl's compute_policy_loss_gspo); no dual clip (nor in verl).
    Returns the per-token loss [B, R] and the statistics of `ppo_clip_policy_loss`, counted per token.
    """
    sequence_log_ratio = masked_mean(logprobs - old_logprobs, mask, axis=-1)
    log_ratio = sequence_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    return clipped_surrogate(log_ratio, advantages, mask, clip_low, clip_high)
