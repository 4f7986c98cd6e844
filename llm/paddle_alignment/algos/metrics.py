"""Metrics of one RL step computed from the experience (TRL PPOv2's names where it has one)."""

from paddle_alignment.algos.masked import masked_mean


def is_maximum(name):
    """A statistic named *_max is a maximum: the micro-batches and ranks of a step combine it by max, the
    others by mean."""
    return name.endswith("_max")


def explained_variance(values, returns, mask):
    """1 - Var[returns - values] / Var[returns] over valid tokens: 1 when the critic predicts the returns,
    0 when it does no better than their mean."""
    residual = returns - values
    residual_var = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    returns_var = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    return 1.0 - residual_var / returns_var.clip(min=1e-8)


def rlhf_objective_metrics(scores, response_mask, logprobs=None, ref_logprobs=None, kl_coeff=0.0):
    """`objective/*` of TRL PPOv2, averaged over responses: the score, and with log-probs the k1 KL
    (summed over each response's tokens), the entropy estimate -sum log p, the KL penalty
    `non_score_reward` = -kl_coeff * KL and `rlhf_reward` = score + non_score_reward."""
    metrics = {"objective/scores": scores.mean()}
    mask = response_mask.astype("float32")
    if logprobs is not None:
        metrics["objective/entropy"] = (-logprobs * mask).sum(axis=-1).mean()
    if logprobs is not None and ref_logprobs is not None:
        kl = ((logprobs - ref_logprobs) * mask).sum(axis=-1)
        metrics["objective/kl"] = kl.mean()
        metrics["objective/non_score_reward"] = (-kl_coeff * kl).mean()
        metrics["objective/rlhf_reward"] = (scores - kl_coeff * kl).mean()
    return {k: float(v) for k, v in metrics.items()}



def score_part_metrics(exp, parts):
    """Each score part's mean and accuracy (the share of responses at the part's max), for a reward with
    parts {name: (min, max)}: the GSM8K recipe's answer_accuracy and format_accuracy."""
    if exp.score_parts is None:
        return {}
    metrics = {}
    for column, (name, (_, best)) in enumerate(parts.items()):
        values = exp.score_parts[:, column]
        metrics[f"{name}_reward_mean"] = float(values.mean())
        metrics[f"{name}_accuracy"] = float((values >= best).astype("float32").mean())
    return metrics
