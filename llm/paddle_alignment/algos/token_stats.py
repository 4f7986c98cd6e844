"""Per-token quantities computed from the policy's logits. Under tensor parallel the logits are Paddle
distributed tensors (models/tensor_parallel.py), split over the vocabulary when the LM head is: the same
formulas run on them, and Paddle's engine reduces the softmax statistics over the ranks."""

import paddle
import paddle.nn.functional as F


def tempered_logits(logits, temperature):
    """float32 logits of the distribution rollouts sample from, softmax(logits / temperature): the log-probs,
    KL and entropy of the rollout policy are those of that distribution (as verl, TRL, OpenRLHF and
    PaddleNLP compute them)."""
    logits = logits.astype("float32")
    return logits if temperature == 1.0 else logits / temperature


def gather_logprobs(logits, labels):
    """log p(labels) under softmax(logits): logits [B, T, V], labels [B, T] -> [B, T] (float32)."""
    nll = F.cross_entropy(logits.astype("float32"), labels.unsqueeze(-1), reduction="none", use_softmax=True)
    return -nll.squeeze(-1)


def entropy_from_logits(logits):
    """Entropy of softmax(logits) per position: [B, T, V] -> [B, T] (float32)."""
    log_probs = F.log_softmax(logits.astype("float32"), axis=-1)
    return -(paddle.exp(log_probs) * log_probs).sum(axis=-1)


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
