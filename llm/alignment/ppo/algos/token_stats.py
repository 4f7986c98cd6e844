"""Per-token quantities computed from the policy's logits."""

import paddle
import paddle.nn.functional as F


def gather_logprobs(logits, labels):
    """log p(labels) under softmax(logits): logits [B, T, V], labels [B, T] -> [B, T] (float32)."""
    logits = logits.astype("float32")
    nll = F.cross_entropy(logits, labels.unsqueeze(-1), reduction="none", use_softmax=True)
    return -nll.squeeze(-1)


def position_ids_from_mask(attention_mask):
    """Positions counted over real tokens only, so left padding does not shift the prompt: [B, L] int64."""
    return (attention_mask.astype("int64").cumsum(axis=-1) - 1).clip(min=0)


def entropy_from_logits(logits):
    """Entropy of softmax(logits) per position: [B, T, V] -> [B, T] (float32)."""
    logits = logits.astype("float32")
    log_probs = F.log_softmax(logits, axis=-1)
    return -(paddle.exp(log_probs) * log_probs).sum(axis=-1)


def end_positions(attention_mask):
    """Index of the last position whose mask is 1, per row: [B, L] -> [B] int64.

    Rows may be left-padded (prompt) and right-padded (response), so this is the last 1 in the mask,
    not `sum(mask) - 1`. An all-zero row gives 0.
    """
    mask = attention_mask.astype("int64")
    positions = paddle.arange(mask.shape[-1], dtype="int64")
    return (mask * positions).max(axis=-1)
