"""Per-token quantities computed from the policy's logits.

With tensor parallelism the LM head may return vocab-parallel logits (`tensor_parallel_output`): each
rank of the model-parallel group holds a contiguous slice of the vocabulary. `gather_logprobs` and
`entropy_from_logits` then take that group and reduce the softmax statistics over it, so log-probs,
entropy (and the KL built from log-probs) equal those of the full logits, gradients included.
"""

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle.autograd import PyLayer


class SumOverGroup(PyLayer):
    """Sum of `x` over the ranks of `group`. Every rank then computes the same loss from the sum, so the
    gradient of each rank's own term is the incoming gradient unchanged (identity backward)."""

    @staticmethod
    def forward(ctx, x, group):
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def shifted_shard(logits, group):
    """float32 logits minus the max over the whole vocabulary (a constant for the softmax: no gradient)."""
    logits = logits.astype("float32")
    shift = logits.max(axis=-1, keepdim=True).detach()
    dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    return logits - shift


def tempered_logits(logits, temperature):
    """float32 logits of the distribution rollouts sample from, softmax(logits / temperature): the log-probs,
    KL and entropy of the rollout policy are those of that distribution (as verl, TRL, OpenRLHF and
    PaddleNLP compute them)."""
    logits = logits.astype("float32")
    return logits if temperature == 1.0 else logits / temperature


def gather_logprobs(logits, labels, vocab_group=None):
    """log p(labels) under softmax(logits): logits [B, T, V] (or this rank's vocab slice [B, T, V/tp] with
    `vocab_group`), labels [B, T] -> [B, T] (float32)."""
    if vocab_group is None:
        nll = F.cross_entropy(logits.astype("float32"), labels.unsqueeze(-1), reduction="none", use_softmax=True)
        return -nll.squeeze(-1)
    shifted = shifted_shard(logits, vocab_group)
    shard_size = shifted.shape[-1]
    local_labels = labels - vocab_group.rank * shard_size
    in_shard = ((local_labels >= 0) & (local_labels < shard_size)).astype("float32")
    picked = paddle.take_along_axis(shifted, local_labels.clip(0, shard_size - 1).unsqueeze(-1), axis=-1).squeeze(-1)
    label_logit = SumOverGroup.apply(picked * in_shard, vocab_group)
    sum_exp = SumOverGroup.apply(paddle.exp(shifted).sum(axis=-1), vocab_group)
    return label_logit - paddle.log(sum_exp)


def entropy_from_logits(logits, vocab_group=None):
    """Entropy of softmax(logits) per position: [B, T, V] (or a vocab slice with `vocab_group`) -> [B, T]
    (float32). With s = logits - max and S = sum exp(s): H = log S - sum(exp(s) s) / S."""
    if vocab_group is None:
        log_probs = F.log_softmax(logits.astype("float32"), axis=-1)
        return -(paddle.exp(log_probs) * log_probs).sum(axis=-1)
    shifted = shifted_shard(logits, vocab_group)
    exp = paddle.exp(shifted)
    sum_exp = SumOverGroup.apply(exp.sum(axis=-1), vocab_group)
    weighted = SumOverGroup.apply((exp * shifted).sum(axis=-1), vocab_group)
    return paddle.log(sum_exp) - weighted / sum_exp


def position_ids_from_mask(attention_mask):
    """Positions counted over real tokens only, so left padding does not shift the prompt: [B, L] int64."""
    return (attention_mask.astype("int64").cumsum(axis=-1) - 1).clip(min=0)


def end_positions(attention_mask):
    """Index of the last position whose mask is 1, per row: [B, L] -> [B] int64.

    Rows may be left-padded (prompt) and right-padded (response), so this is the last 1 in the mask,
    not `sum(mask) - 1`. An all-zero row gives 0.
    """
    mask = attention_mask.astype("int64")
    positions = paddle.arange(mask.shape[-1], dtype="int64")
    return (mask * positions).max(axis=-1)
