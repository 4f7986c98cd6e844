"""Data sets and batches of preference training: each group (a prompt and its replies: DPO's chosen and rejected,
KTO's response and its KL response) is one packed forward (models/packed_sequences.py).

An item of the data set is a list of group indices: one group, or with `greedy_zero_padding` as many as fit in
max_seq_len tokens, so that per_device_train_batch_size counts packed sequences as in PaddleNLP."""

import numpy as np
import paddle

from paddle_alignment.data.preference import PreferencePair
from paddle_alignment.models.packed_sequences import group_length, pack_groups, rows_of_groups


def group_of(item):
    """(prompt, [replies]) of a PreferencePair (chosen, rejected) or a RatedResponse (response, KL response)."""
    if isinstance(item, PreferencePair):
        return item.prompt, [item.chosen, item.rejected]
    return item.prompt, [item.response, item.kl_response]


class GroupDataset(paddle.io.Dataset):
    """Items of group indices into `records` (PreferencePairs or RatedResponses). `reference` [groups, replies]:
    the reference's log-prob sums, once precomputed."""

    def __init__(self, records, max_seq_len, pack):
        self.records = records
        self.reference = None
        lengths = [group_length(*group_of(record)) for record in records]
        rows = rows_of_groups(lengths, max_seq_len if pack else 0)
        self.items = sorted(rows) if pack else rows  # in data order where one group is one item

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        """[(record, its reference log-prob sums [replies] or None)] of the item's groups."""
        return [(self.records[g], None if self.reference is None else self.reference[g]) for g in self.items[index]]


class GroupCollator:
    """A list of items -> the packed batch's tensors (PackedBatch's fields, each item one row), plus `desirable`
    [G] for rated responses and `reference_logps` [S] (sequence order: reply j of group g is j x G + g) where
    precomputed."""

    def __init__(self, pad_token_id):
        self.pad_token_id = pad_token_id

    def __call__(self, items):
        groups = [group for item in items for group in item]
        records = [record for record, _ in groups]
        rows, start = [], 0
        for item in items:
            rows.append(list(range(start, start + len(item))))
            start += len(item)
        batch = vars(pack_groups([group_of(r) for r in records], self.pad_token_id, rows=rows))
        if not isinstance(records[0], PreferencePair):
            batch["desirable"] = paddle.to_tensor([r.desirable for r in records])
        if groups[0][1] is not None:
            batch["reference_logps"] = paddle.to_tensor(np.stack([values for _, values in groups]).T.reshape(-1))
        return batch


def group_batches(count, size):
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def sequence_order(values, groups):
    """[S] values in sequence order -> [groups, replies]."""
    return np.asarray(values).reshape(-1, groups).T
