"""Pairwise (Bradley-Terry) losses of reward-model training, selected by `loss_type`.

Each takes the per-token scores [N, L] of the better and the worse sequences of N pairs (padded on the
right to one width L), their input ids and attention masks, and returns a scalar loss.
"""

import paddle
import paddle.nn.functional as F

from paddle_alignment.algos.registry import PAIRWISE_LOSSES
from paddle_alignment.algos.token_stats import end_positions


def end_scores(scores, mask):
    """The score at each sequence's last token: [N, L] -> [N]."""
    return paddle.take_along_axis(scores, end_positions(mask).unsqueeze(-1), axis=-1).squeeze(-1)


@PAIRWISE_LOSSES.register("sequence-wise")
def sequence_wise_loss(better_scores, worse_scores, better_ids, worse_ids, better_mask, worse_mask, regularization=0.0):
    """-log sigmoid(r_better - r_worse) on the end scores, plus `regularization` x their mean square
    (which keeps the scores near zero)."""
    better, worse = end_scores(better_scores, better_mask), end_scores(worse_scores, worse_mask)
    loss = -F.log_sigmoid(better - worse).mean()
    if regularization > 0:
        loss = loss + regularization * paddle.stack([better, worse]).square().mean()
    return loss


@PAIRWISE_LOSSES.register("token-wise")
def token_wise_loss(better_scores, worse_scores, better_ids, worse_ids, better_mask, worse_mask, regularization=0.0):
    """-log sigmoid(r_better,t - r_worse,t) averaged over the tokens from where the two sequences diverge
    to the end of the longer one, then over pairs; `regularization` x the mean square of those scores."""
    positions = paddle.arange(better_ids.shape[1]).unsqueeze(0)
    differs = (better_ids != worse_ids) | (better_mask != worse_mask)
    diverge = paddle.argmax(differs.astype("int32"), axis=-1).unsqueeze(-1)
    end = paddle.maximum(end_positions(better_mask), end_positions(worse_mask)).unsqueeze(-1)
    window = ((positions >= diverge) & (positions <= end)).astype(better_scores.dtype)
    count = window.sum(axis=-1)
    per_pair = (-F.log_sigmoid(better_scores - worse_scores) * window).sum(axis=-1) / count
    loss = per_pair.mean()
    if regularization > 0:
        squares = ((better_scores.square() + worse_scores.square()) / 2 * window).sum(axis=-1) / count
        loss = loss + regularization * squares.mean()
    return loss


def scored_pairs(pairwise_loss, scores, input_ids, attention_mask, regularization=0.0):
    """The pairwise loss of a collated batch of N pairs (the N better sequences, then the N worse: [2N, L]
    `scores`, ids and mask), and the better and worse end scores [N]: what a score model's forward and a
    score pipe's last stage both compute from their scores."""
    n = scores.shape[0] // 2
    loss = pairwise_loss(
        scores[:n], scores[n:], input_ids[:n], input_ids[n:], attention_mask[:n], attention_mask[n:], regularization=regularization
    )
    ends = end_scores(scores, attention_mask)
    return loss, ends[:n], ends[n:]
