"""Packed forwards: a prompt and its replies in one row, the prompt computed once, each reply attending to the
prompt and to itself only; with `pack_rows`, several such groups in one row (PaddleNLP's greedy zero padding).

A group of prompt p (P tokens) and replies r_1..r_k is laid out as

    p[:-1] | p[-1] r_1[:-1] | p[-1] r_2[:-1] | ...      positions 0..P-2, then P-1.. again for every reply

so the output at each reply segment's first token (the prompt's last token, repeated) predicts the reply's
first token and every reply token is predicted from exactly the context it has when the reply is written
alone: the log-probs equal those of separate prompt + reply forwards, and a row holds P - 1 + sum(|r_j|)
tokens. The attention mask [B, L, L] lets a token see the tokens before it in its own group's prompt and its
own segment. Reply j of group g is sequence j x G + g (G groups): for DPO the N chosen replies come first, then
the N rejected.
"""

from dataclasses import dataclass

import numpy as np
import paddle

from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy
from paddle_alignment.models.head_logprobs import DEFAULT_CHUNK_TOKENS, head_token_stats
from paddle_alignment.models.ppo_model_utils import chunkable_lm_head, lm_head_skipped


@dataclass
class PackedBatch:
    """input_ids, position_ids [B, L]; attention_mask [B, L, L] bool; for the T predicted tokens in sequence
    order: label_positions [T] (flat indices into B x L of the positions that predict them), labels [T],
    sequence_ids [T]; and each sequence's token count, lengths [S]."""

    input_ids: paddle.Tensor
    position_ids: paddle.Tensor
    attention_mask: paddle.Tensor
    label_positions: paddle.Tensor
    labels: paddle.Tensor
    sequence_ids: paddle.Tensor
    lengths: paddle.Tensor

    @property
    def num_sequences(self):
        return self.lengths.shape[0]


def group_tokens(prompt, replies):
    """A group's row tokens, positions, segment (-1 prompt, j reply j) and, per reply, the row offsets of the
    positions that predict its tokens."""
    tokens, positions, segments = list(prompt[:-1]), list(range(len(prompt) - 1)), [-1] * (len(prompt) - 1)
    predictors = []
    for j, reply in enumerate(replies):
        start = len(tokens)
        segment = [prompt[-1]] + list(reply[:-1])
        tokens += segment
        positions += range(len(prompt) - 1, len(prompt) - 1 + len(segment))
        segments += [j] * len(segment)
        predictors.append(list(range(start, start + len(reply))))
    return tokens, positions, segments, predictors


def group_length(prompt, replies):
    return len(prompt) - 1 + sum(len(r) for r in replies)


def rows_of_groups(lengths, row_tokens):
    """Groups assigned to rows: one a row, or with `row_tokens` packed first-fit by decreasing length into rows
    of at most that many tokens (a longer group has a row of its own)."""
    if not row_tokens:
        return [[g] for g in range(len(lengths))]
    rows, room = [], []
    for g in sorted(range(len(lengths)), key=lambda g: -lengths[g]):
        fit = next((r for r, left in enumerate(room) if left >= lengths[g]), None)
        if fit is None:
            rows.append([g])
            room.append(row_tokens - lengths[g])
        else:
            rows[fit].append(g)
            room[fit] -= lengths[g]
    return rows


def pack_groups(groups, pad_token_id, row_tokens=0, rows=None):
    """PackedBatch of `groups` ([(prompt ids, [reply ids, ...])], every group with the same number of replies):
    each group a row padded on the right, or packed into rows of `row_tokens` (see rows_of_groups), or into the
    given `rows` (lists of group indices)."""
    replies_per_group = {len(replies) for _, replies in groups}
    if len(replies_per_group) != 1:
        raise ValueError(f"every group needs the same number of replies, got {sorted(replies_per_group)}")
    count = len(groups)
    laid_out = [group_tokens(prompt, replies) for prompt, replies in groups]
    rows = rows or rows_of_groups([len(tokens) for tokens, *_ in laid_out], row_tokens)
    width = max(sum(len(laid_out[g][0]) for g in row) for row in rows)
    ids = np.full((len(rows), width), pad_token_id, dtype="int64")
    positions = np.zeros((len(rows), width), dtype="int64")
    mask = np.zeros((len(rows), width, width), dtype=bool)
    predictor_of = {}
    for r, row in enumerate(rows):
        offset = 0
        for g in row:
            tokens, group_positions, segments, predictors = laid_out[g]
            n = len(tokens)
            ids[r, offset : offset + n] = tokens
            positions[r, offset : offset + n] = group_positions
            segments = np.asarray(segments)
            visible = np.tril(np.ones((n, n), dtype=bool)) & ((segments[None, :] == -1) | (segments[None, :] == segments[:, None]))
            mask[r, offset : offset + n, offset : offset + n] = visible
            for j, offsets in enumerate(predictors):
                predictor_of[j * count + g] = [r * width + offset + o for o in offsets]
            offset += n
        mask[r, np.arange(offset, width), np.arange(offset, width)] = True  # padding sees itself: no empty softmax row
    sequences = range(len(predictor_of))
    label_positions = np.concatenate([predictor_of[s] for s in sequences]).astype("int64")
    labels = np.concatenate([groups[s % count][1][s // count] for s in sequences])  # each reply's own tokens
    sequence_ids = np.concatenate([[s] * len(predictor_of[s]) for s in sequences]).astype("int32")
    lengths = np.asarray([len(predictor_of[s]) for s in sequences], dtype="float32")
    return PackedBatch(*(paddle.to_tensor(a) for a in (ids, positions, mask, label_positions, labels.astype("int64"), sequence_ids, lengths)))


@dataclass
class SequenceStats:
    """Per sequence [S]: the sum of its token log-probs, of its tokens' entropies and of its tokens' mean logit
    over the vocabulary (TRL's logits/chosen), and its token count."""

    logp_sums: paddle.Tensor
    entropy_sums: paddle.Tensor
    mean_logit_sums: paddle.Tensor
    lengths: paddle.Tensor

    @property
    def logp_means(self):
        return self.logp_sums / self.lengths


def per_sequence(values, batch):
    """Sums [S] of token values [T] per sequence: a product with the tokens' one-hot sequence matrix (T x S, small
    beside the activations), which, unlike segment_sum, runs on the tensor-parallel plan's distributed tensors."""
    members = paddle.nn.functional.one_hot(batch.sequence_ids.astype("int64"), batch.num_sequences).astype(values.dtype)
    return paddle.matmul(values.unsqueeze(0), members)[0]


def packed_sequence_stats(model, batch, chunk_tokens=DEFAULT_CHUNK_TOKENS):
    """SequenceStats of `batch` under `model`, with gradients when grad is enabled. Where the LM head allows
    (ppo_model_utils.chunkable_lm_head) only the predicting positions go through it, chunk_tokens at a time, so
    no [tokens, vocabulary] logits exist beyond one chunk; otherwise from the whole logits."""
    head = chunkable_lm_head(model)
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "attention_mask": batch.attention_mask,
              "return_dict": True}
    if head is None:
        logits = model(**inputs).logits
        picked = paddle.gather(logits.reshape([-1, logits.shape[-1]]), batch.label_positions)
        logps, entropy = token_logprobs_and_entropy(picked, batch.labels)
        with paddle.no_grad():
            mean_logits = picked.astype("float32").mean(axis=-1)
    else:
        with lm_head_skipped(head, slice(None)):
            hidden = model(**inputs).logits  # the head returns its input: hidden states
        picked = paddle.gather(hidden.reshape([-1, hidden.shape[-1]]), batch.label_positions)
        transpose = getattr(head, "transpose_y", False)
        logps, entropy = head_token_stats(picked.unsqueeze(0), head.weight, transpose, batch.labels.unsqueeze(0), 1.0, chunk_tokens)
        logps, entropy = logps[0], entropy[0]
        with paddle.no_grad():  # the mean of h . w_v over the vocabulary is h . (the mean w_v): no logits needed
            mean_row = head.weight.astype("float32").mean(axis=0 if transpose else 1)
            mean_logits = paddle.matmul(picked.astype("float32"), mean_row.reshape([-1, 1]))[:, 0]
    return SequenceStats(per_sequence(logps, batch), per_sequence(entropy.detach(), batch),
                         per_sequence(mean_logits, batch), batch.lengths)
