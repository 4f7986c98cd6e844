"""Token-level losses and their aggregation over the response mask."""

import paddle

from llm.alignment.ppo.algos.registry import LOSS_AGGREGATIONS, POLICY_LOSSES


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(values, mask):
    """Mean over every valid token of the batch: long responses weigh more (DAPO's choice)."""
    mask = mask.astype(values.dtype)
    return (values * mask).sum() / mask.sum().clip(min=1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(values, mask):
    """Mean over tokens inside each response, then over responses: every response weighs the same (GRPO paper)."""
    mask = mask.astype(values.dtype)
    per_sequence = (values * mask).sum(axis=-1) / mask.sum(axis=-1).clip(min=1.0)
    return per_sequence.mean()


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(values, mask):
    """Sum over tokens inside each response, then mean over responses (Dr.GRPO, up to a constant)."""
    return (values * mask.astype(values.dtype)).sum(axis=-1).mean()


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    """PPO clipped surrogate with separate bounds: ratio is clipped to [1 - clip_low, 1 + clip_high].

    Returns the per-token loss [B, R] and a dict of scalar statistics over valid tokens:
    `clipfrac_low` (negative advantage, ratio below the low bound), `clipfrac_high` (positive
    advantage, ratio above the high bound), their sum `policy/clipfrac_avg`, `policy/approxkl_avg`
    (k3 estimate of KL(old || new)) and the ratio's mean and variance `val/ratio`, `val/ratio_var`
    (TRL's names).
    """
    return clipped_surrogate(logprobs - old_logprobs, advantages, mask, clip_low, clip_high)


def clipped_surrogate(log_ratio, advantages, mask, clip_low, clip_high):
    """max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) per token with r = exp(log_ratio), and its statistics."""
    ratio = paddle.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * paddle.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = paddle.maximum(unclipped, clipped)
    with paddle.no_grad():
        dtype = log_ratio.dtype
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).astype(dtype)
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).astype(dtype)
        ratio_mean = token_mean(ratio, mask)
        stats = {
            "clipfrac_low": token_mean(low, mask),
            "clipfrac_high": token_mean(high, mask),
            "policy/clipfrac_avg": token_mean(low + high, mask),
            "policy/approxkl_avg": token_mean(ratio - 1.0 - log_ratio, mask),
            "val/ratio": ratio_mean,
            "val/ratio_var": token_mean((ratio - ratio_mean) ** 2, mask),
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
        clipfrac = token_mean((clipped_error > unclipped_error).astype(values.dtype), mask)
    return loss, {"val/clipfrac_avg": clipfrac}


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    """GSPO: one importance ratio per sequence, exp(mean over its tokens of log pi - log pi_old), clipped
    to [1 - clip_low, 1 + clip_high]. Written per token as sg[s] * pi / sg[pi], so every token of a
    response gets the sequence's ratio in value and its own log-prob in the gradient.

    Returns the per-token loss [B, R] and the statistics of `ppo_clip_policy_loss`, counted per token.
    """
    mask_f = mask.astype(logprobs.dtype)
    sequence_log_ratio = ((logprobs - old_logprobs) * mask_f).sum(axis=-1) / mask_f.sum(axis=-1).clip(min=1.0)
    log_ratio = sequence_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    return clipped_surrogate(log_ratio, advantages, mask, clip_low, clip_high)
