"""The statistics of one update (the passes over a step's experience), gathered from its micro-batches and
reduced over the ranks: what the trainer logs, whatever the layout that computed them."""

import math

import paddle.distributed as dist

from paddle_alignment.algos.metrics import is_maximum
from paddle_alignment.distributed import all_reduce_scalars, collective, mean_over_ranks


class UpdateMetrics:
    """`loss/*` statistics are each micro-batch's share of its optimizer step's loss, so their sums over a step
    and mean over ranks are the step's loss, averaged over steps; a statistic given as (sum, count) is a mean
    over every token of the update and the ranks; a maximum (is_maximum) is the largest; any other is a mean
    over micro-batches and ranks."""

    def __init__(self):
        self.shares, self.means, self.maxima, self.ratios, self.micro_batches = {}, {}, {}, {}, 0

    def add(self, stats):
        """One micro-batch's statistics (tensors or floats, (sum, count) pairs of either)."""
        for key, value in stats.items():
            if isinstance(value, tuple):
                self.ratios[f"{key}:sum"] = self.ratios.get(f"{key}:sum", 0.0) + float(value[0])
                self.ratios[f"{key}:count"] = self.ratios.get(f"{key}:count", 0.0) + float(value[1])
            elif is_maximum(key):
                self.maxima[key] = max(self.maxima.get(key, -math.inf), float(value))
            else:
                pool = self.shares if key.startswith("loss/") else self.means
                pool[key] = pool.get(key, 0.0) + float(value)
        self.micro_batches += 1

    def share_from(self, group, source):
        """Take the statistics gathered on global rank `source` of `group` (the last pipeline stage, where the
        losses are computed) on every rank of it."""
        gathered = [vars(self)]
        with collective("the update statistics from the last pipeline stage"):
            dist.broadcast_object_list(gathered, src=source, group=group)
        vars(self).update(gathered[0])

    def reduced(self, optimizer_steps):
        """The update's metrics over every data rank (every rank calls it)."""
        metrics = mean_over_ranks(
            {k: v / optimizer_steps for k, v in self.shares.items()} | {k: v / self.micro_batches for k, v in self.means.items()},
            "update metrics",
        )
        metrics |= all_reduce_scalars(self.maxima, op=dist.ReduceOp.MAX, what="update metrics")
        return metrics | token_weighted_means(all_reduce_scalars(self.ratios, what="update metrics"))


def token_weighted_means(sums):
    """{key: sum / count} of the "key:sum" and "key:count" totals in `sums`, for the keys with a count."""
    keys = [key[: -len(":sum")] for key in sums if key.endswith(":sum")]
    return {key: sums[f"{key}:sum"] / sums[f"{key}:count"] for key in keys if sums[f"{key}:count"] > 0}
