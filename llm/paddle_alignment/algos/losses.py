"""Token-level losses and their aggregation over the response mask."""

from dataclasses import dataclass

import paddle

from paddle_alignment.algos.kl import MAX_LOG_RATIO
from paddle_alignment.algos.masked import masked_mean, masked_sum
from paddle_alignment.algos.registry import LOSS_AGGREGATIONS, POLICY_LOSSES


@dataclass(frozen=True)
class LossScale:
    """What one optimizer step's loss is averaged over: its valid response `tokens` and its `sequences`,
    counted over every micro-batch of the step (gradient accumulation) and every data-parallel rank, the
    number of those `ranks` (data parallel averages their gradients, so each rank's part of the sum is
    multiplied back by it), and the `response_budget` (max_dec_len) that Dr.GRPO divides by. Each
    micro-batch's loss is then its share of the step's mean, and the accumulated, averaged gradient is that
    of the mean over the whole step (verl's global token mean, TRL's `dapo` normaliser)."""

    tokens: float
    sequences: float
    ranks: int = 1
    response_budget: float = None  # seq-mean-token-sum-norm's constant: the most tokens a response may have

    @classmethod
    def of(cls, mask, response_budget=None):
        """The scale of a batch that is a whole step on its own (one micro-batch, one rank); the budget, unless
        given, its width (verl's default)."""
        return cls(mask.astype("float32").sum().clip(min=1.0), mask.shape[0], response_budget=response_budget or mask.shape[1])


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


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(values, mask, scale=None):
    """Sum over tokens inside each response, over the step's responses, divided by the responses times a
    constant, the response budget (max_dec_len): Dr.GRPO's normaliser (TRL's `dr_grpo`), which no response's
    length changes."""
    scale = scale or LossScale.of(mask)
    return masked_sum(values, mask).sum() / (scale.sequences * scale.response_budget) * scale.ranks


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_policy_loss(logprobs, old_logprobs, advantages, mask, clip_range_ratio_low, clip_range_ratio_high,
                         clip_ratio_c=0.0):
    """PPO clipped surrogate with separate bounds (the config keys of its parameters): ratio is clipped to
    [1 - clip_range_ratio_low, 1 + clip_range_ratio_high]; with `clip_ratio_c` > 1, dual-clip PPO caps the
    loss of negative-advantage tokens at -A * clip_ratio_c (verl's `clip_ratio_c`), so one very unlikely token
    cannot dominate the step.

    Returns the per-token loss [B, R] and a dict of scalar statistics over valid tokens:
    `clipfrac_low` (negative advantage, ratio below the low bound), `clipfrac_high` (positive
    advantage, ratio above the high bound), their sum `policy/clipfrac_avg`, `clipfrac_dual` (tokens
    the dual clip caps), `policy/approxkl_avg` (k3 estimate of KL(old || new)) and the ratio's mean and
    variance `val/ratio`, `val/ratio_var` (TRL's names).
    """
    return clipped_surrogate(
        logprobs - old_logprobs, advantages, mask, clip_range_ratio_low, clip_range_ratio_high, clip_ratio_c
    )


def clipped_surrogate(log_ratio, advantages, mask, clip_low, clip_high, clip_ratio_c=0.0):
    """max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) per token with r = exp(log_ratio), capped at
    -A * clip_ratio_c where A < 0 when clip_ratio_c is set, and its statistics."""
    ratio = bounded_ratio(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * paddle.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = paddle.maximum(unclipped, clipped)
    dual = paddle.zeros_like(loss, dtype="bool")
    if clip_ratio_c:
        cap = -advantages * clip_ratio_c
        dual = (advantages < 0) & (loss > cap)
        loss = paddle.where(dual, cap, loss)
    with paddle.no_grad():
        low = (ratio < 1.0 - clip_low) & (advantages < 0)
        high = (ratio > 1.0 + clip_high) & (advantages > 0)
        stats = ratio_stats(ratio, log_ratio, mask, low, high)
        stats["clipfrac_dual"] = masked_mean(dual.astype(ratio.dtype), mask)
    return loss, stats


def bounded_ratio(log_ratio):
    """exp(log_ratio) with the log-ratio clamped to +-MAX_LOG_RATIO first (verl, OpenRLHF): a token whose
    probability moved by e^90 gives a large, finite ratio, not inf, and a zero gradient, not NaN; a NaN on
    a masked-out token would otherwise make the whole aggregated loss NaN."""
    return paddle.exp(log_ratio.clip(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def k3_of_ratio(ratio, log_ratio):
    """k3 per token, ratio - 1 - log ratio (the log-ratio clamped as `bounded_ratio` clamps it): with tokens
    drawn from the ratio's denominator policy, an estimate of KL(denominator || numerator)."""
    return ratio - 1.0 - log_ratio.clip(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def ratio_stats(ratio, log_ratio, mask, low, high):
    """The statistics every ratio-based policy loss logs, over valid tokens: `clipfrac_low` / `clipfrac_high`
    (tokens the loss bounds below / above: `low`, `high` [B, R] bool), their sum `policy/clipfrac_avg`,
    `policy/approxkl_avg` (k3 estimate of KL(old || new)) and the ratio's mean and variance `val/ratio`,
    `val/ratio_var` (TRL's names)."""
    dtype = ratio.dtype
    low, high = low.astype(dtype), high.astype(dtype)
    ratio_mean = masked_mean(ratio, mask)
    return {
        "clipfrac_low": masked_mean(low, mask),
        "clipfrac_high": masked_mean(high, mask),
        "policy/clipfrac_avg": masked_mean(low + high, mask),
        "policy/approxkl_avg": masked_mean(k3_of_ratio(ratio, log_ratio), mask),
        "val/ratio": ratio_mean,
        "val/ratio_var": masked_mean((ratio - ratio_mean) ** 2, mask),
    }


def clipped_value_loss(values, old_values, returns, mask, clip_range_value):
    """PPO's value loss 0.5 * max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2) per token [B, R], and
    `val/clipfrac_avg`: the share of valid tokens where the clipped term is the larger."""
    # V itself where it is within c of V_old (not V_old + (V - V_old), which float32 rounds away from V, so
    # that unclipped tokens were counted as clipped).
    clipped = paddle.minimum(paddle.maximum(values, old_values - clip_range_value), old_values + clip_range_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped - returns) ** 2
    loss = 0.5 * paddle.maximum(unclipped_error, clipped_error)
    with paddle.no_grad():
        clipfrac = masked_mean((clipped_error > unclipped_error).astype(values.dtype), mask)
    return loss, {"val/clipfrac_avg": clipfrac}


@POLICY_LOSSES.register("gspo", loss_agg_mode="seq-mean-token-mean")
def gspo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_range_ratio_low, clip_range_ratio_high):
    """GSPO: one importance ratio per sequence, exp(mean over its tokens of log pi - log pi_old), clipped
    to [1 - clip_range_ratio_low, 1 + clip_range_ratio_high]. Written per token as sg[s] * pi / sg[pi], so every
    token of a response gets the sequence's ratio in value and its own log-prob in the gradient.

    The objective is a mean over sequences, so it is aggregated with seq-mean-token-mean whatever
    `loss_agg_mode` says (the GSPO paper; verl's compute_policy_loss_gspo); no dual clip (nor in verl).
    Returns the per-token loss [B, R] and the statistics of `ppo_clip_policy_loss`, counted per token.
    """
    sequence_log_ratio = masked_mean(logprobs - old_logprobs, mask, axis=-1)
    log_ratio = sequence_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    return clipped_surrogate(log_ratio, advantages, mask, clip_range_ratio_low, clip_range_ratio_high)


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_range_ratio_low, clip_range_ratio_high):
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - clip_range_ratio_low, 1 + clip_range_ratio_high)) * A * log pi per
    token. The importance weight is clipped and detached, so no token loses its gradient (PPO's clip drops
    tokens whose ratio left the range); clip_range_ratio_low 1 sets no lower bound (the paper's choice: it
    tunes only clip_range_ratio_high).
    `clipfrac_low` / `clipfrac_high` count the tokens whose weight was clipped."""
    log_ratio = logprobs - old_logprobs
    with paddle.no_grad():
        ratio = bounded_ratio(log_ratio)
        weight = paddle.clip(ratio, 1.0 - clip_range_ratio_low, 1.0 + clip_range_ratio_high)
        low, high = ratio < 1.0 - clip_range_ratio_low, ratio > 1.0 + clip_range_ratio_high
        stats = ratio_stats(ratio, log_ratio, mask, low, high)
    return -weight * advantages * logprobs, stats


@POLICY_LOSSES.register("sapo")
def sapo_policy_loss(logprobs, old_logprobs, advantages, mask, sapo_tau_pos=1.0, sapo_tau_neg=1.05):
    """SAPO (soft adaptive policy optimization): -(4 / tau) * sigmoid(tau * (r - 1)) * A per token, a smooth
    gate in place of the clip, with tau = sapo_tau_pos where A > 0 and sapo_tau_neg elsewhere (the paper's
    1.0 and 1.05). At r = 1 its gradient is the policy gradient's; away from 1 it fades instead of stopping.
    `clipfrac_*` count nothing (no clip): they read 0, so that the curves stay comparable."""
    log_ratio = logprobs - old_logprobs
    ratio = bounded_ratio(log_ratio)
    tau = paddle.where(advantages > 0, paddle.full_like(ratio, sapo_tau_pos), paddle.full_like(ratio, sapo_tau_neg))
    loss = -(4.0 / tau) * paddle.nn.functional.sigmoid(tau * (ratio - 1.0)) * advantages
    with paddle.no_grad():
        never = paddle.zeros_like(ratio, dtype="bool")
        stats = ratio_stats(ratio, log_ratio, mask, never, never)
    return loss, stats


@POLICY_LOSSES.register("gmpo", loss_agg_mode="seq-mean-token-mean")
def gmpo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_range_ratio_low, clip_range_ratio_high):
    """GMPO (geometric-mean policy optimization): one ratio per sequence, the geometric mean of its tokens'
    ratios, each token's log-ratio first clipped to [-clip_range_ratio_low, clip_range_ratio_high] on the side its
    advantage pessimises (as PPO's min, in log space: the paper's range is 0.4 on each side); the sequence's loss is
    -mean(A) * exp(mean clipped log-ratio), given to each of its tokens and aggregated with
    seq-mean-token-mean, so that the step's loss is the mean over sequences (verl's geo_mean)."""
    log_ratio = (logprobs - old_logprobs).clip(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    sign = paddle.sign(advantages)
    bounded = log_ratio.clip(-clip_range_ratio_low, clip_range_ratio_high)
    pessimistic = sign * paddle.minimum(sign * log_ratio, sign * bounded)
    sequence_ratio = paddle.exp(masked_mean(pessimistic, mask, axis=-1))
    sequence_advantage = masked_mean(advantages, mask, axis=-1)
    loss = (-sequence_advantage * sequence_ratio).unsqueeze(-1) * paddle.ones_like(log_ratio)
    with paddle.no_grad():
        clipped = log_ratio != bounded
        stats = ratio_stats(paddle.exp(log_ratio), log_ratio, mask, clipped & (advantages < 0), clipped & (advantages > 0))
    return loss, stats
