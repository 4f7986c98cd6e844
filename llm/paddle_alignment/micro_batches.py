"""Micro-batches formed by a token budget rather than a row count, each cut to the width its own rows need.

GRPO responses of one batch range from tens to thousands of tokens, and a micro-batch of a fixed number
of rows in rollout order pads every row to the longest of the whole batch. Here the rows of one optimizer
step are ordered by length, consecutive rows share a micro-batch while rows x (longest prompt + longest
response among them) stays within the budget, and each micro-batch drops the padding columns none of
its rows uses (`Experience.trimmed`): the passes compute on close to the real tokens only (verl's dynamic
batch size, OpenRLHF's packing by a token budget, without packing several sequences into one row).

What is computed does not change: positions come from the attention mask, padding is masked, and every
loss aggregation divides by the whole step's token or sequence count (LossScale), whatever its split.
"""

import numpy as np
import paddle
import paddle.distributed as dist

from paddle_alignment.distributed import all_reduce_scalars
from paddle_alignment.experience import padded_on_axis_1


def padded_tokens(prompt, response, rows):
    """Tokens a micro-batch of `rows` computes on once cut to its rows' width."""
    return len(rows) * (int(prompt[rows].max()) + int(response[rows].max())) if len(rows) else 0


def token_budget_batches(prompt, response, rows, budget, count=None):
    """`rows` (indices) in micro-batches of at most `budget` padded tokens each (a row longer than the budget
    alone), consecutive in order of (response, prompt) length; `count`: split the largest micro-batches in
    halves until there are that many (data-parallel ranks must take the same number of backward passes)."""
    order = sorted(rows, key=lambda row: (response[row], prompt[row], row))
    batches, current, widest_prompt, longest_response = [], [], 0, 0
    for row in order:
        widest_prompt, longest_response = max(widest_prompt, prompt[row]), max(longest_response, response[row])
        if current and (len(current) + 1) * (widest_prompt + longest_response) > budget:
            batches.append(current)
            current, widest_prompt, longest_response = [], prompt[row], response[row]
        current.append(row)
    if current:
        batches.append(current)
    if count is not None:
        if count > len(rows):
            raise ValueError(f"{len(rows)} rows cannot form {count} micro-batches")
        while len(batches) < count:
            largest = max(range(len(batches)), key=lambda i: (len(batches[i]) > 1, padded_tokens(prompt, response, np.array(batches[i]))))
            half = len(batches[largest]) // 2
            batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
    return batches


class MicroBatching:
    """How a pass splits rows into micro-batches: by a token budget, each micro-batch trimmed to its rows'
    width (`dynamic`, the default), or `rows_per_batch` rows at a time in rollout order, padded to the whole
    batch's width. The budget is `max_tokens`, or (<= 0) `rows_per_batch` x the batch's longest prompt plus
    longest response: never more padded tokens in a micro-batch than the fixed split would have."""

    def __init__(self, rows_per_batch, dynamic=True, max_tokens=-1):
        self.rows_per_batch, self.dynamic, self.max_tokens = rows_per_batch, dynamic, max_tokens

    @classmethod
    def from_args(cls, args, rows_per_batch):
        return cls(rows_per_batch, args.use_dynamic_batch_size, args.max_token_len_per_device)

    def split(self, exp, rows, count=None):
        """Lists of the indices `rows` of `exp`, one per micro-batch (see token_budget_batches for `count`)."""
        rows = list(rows)
        if not self.dynamic:
            return [rows[i : i + self.rows_per_batch] for i in range(0, len(rows), self.rows_per_batch)]
        prompt, response = exp.real_lengths()
        budget = self.max_tokens if self.max_tokens > 0 else self.rows_per_batch * int(prompt.max() + response.max())
        return token_budget_batches(prompt, response, rows, budget, count)

    def splits_in_lockstep(self, exp, row_lists, what):
        """split(exp, rows) of each of `row_lists`, into as many micro-batches on every data rank as the rank that
        needs the most (`what`: whose counts, for the watchdog's messages)."""
        needed = {i: len(self.split(exp, rows)) for i, rows in enumerate(row_lists)}
        counts = all_reduce_scalars(needed, dist.ReduceOp.MAX, f"micro-batch counts of {what}")
        return [self.split(exp, rows, int(counts[i])) for i, rows in enumerate(row_lists)]

    def micro_batch(self, exp, rows):
        return exp.take(rows).trimmed() if self.dynamic else exp.take(rows)

    def run(self, exp, pass_fn, lockstep=False):
        """`pass_fn(micro)` -> per-token values [b, r] (or [b, r, k], or a tuple of such) of each micro-batch of all
        of `exp`'s rows, put back together as [B, R] (...) in `exp`'s row order, zero where a micro-batch was
        narrower. `lockstep`: as many micro-batches on every data rank (the most any needs), for a model whose
        forwards hold collectives."""
        width = exp.response_mask.shape[1]
        rows = range(len(exp))
        batches = self.splits_in_lockstep(exp, [rows], "a pass")[0] if lockstep else self.split(exp, rows)
        parts, order = [], []
        for rows in batches:
            values = pass_fn(self.micro_batch(exp, rows))
            values = values if isinstance(values, tuple) else (values,)
            parts.append([padded_on_axis_1(value, 0, width - value.shape[1]) for value in values])
            order += rows
        restored = paddle.to_tensor(np.argsort(order), dtype="int64")
        results = tuple(paddle.gather(paddle.concat(column), restored) for column in zip(*parts))
        return results if len(results) > 1 else results[0]
