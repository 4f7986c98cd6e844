"""Per-token quantities computed from the policy's logits."""

import paddle
import paddle.nn.functional as F


def gather_logprobs(logits, labels):
    """log p(labels) under softmax(logits): logits [B, T, V], labels [B, T] -> [B, T] (float32)."""
    logits = logits.astype("float32")
    nll = F.cross_entropy(logits, labels.unsqueeze(-1), reduction="none", use_softmax=True)
    return -nll.squeeze(-1)


def entropy_from_logits(logits):
    """Entropy of softmax(logits) per position: [B, T, V] -> [B, T] (float32)."""
    logits = logits.astype("float32")
    log_probs = F.log_softmax(logits, axis=-1)
    return -(paddle.exp(log_probs) * log_probs).sum(axis=-1)
