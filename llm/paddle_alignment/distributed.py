"""Reductions over the data-parallel ranks (Paddle collectives only).

Under fleet hybrid parallel, the ranks of one tensor- or pipeline-parallel group share a batch: only
data-parallel and sharding ranks hold different data. Sums over all ranks are therefore divided by the
number of copies of each batch, and data is split over the data ranks only.
"""

import contextlib
import logging
import os
import sys

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

from paddle_alignment import watchdog


def is_distributed():
    return dist.is_initialized() and dist.get_world_size() > 1


def collective(what):
    """A context in which this rank waits on the other ranks for `what`, under the watchdog's deadline (a
    no-op in a single process)."""
    if not is_distributed():
        return contextlib.nullcontext()
    return watchdog.guarded("collective", f"{what} over {dist.get_world_size()} ranks")


def hybrid_communicate_group():
    """fleet's hybrid communicate group once fleet hybrid parallel is initialised, else None."""
    return getattr(fleet.fleet, "_hcg", None)


def data_parallel_rank_and_size():
    """(rank, size) among the ranks that hold different data: data-parallel x sharding ranks under fleet
    hybrid parallel, else all ranks."""
    hcg = hybrid_communicate_group()
    if hcg is not None:
        sharding = hcg.get_sharding_parallel_world_size()
        rank = hcg.get_data_parallel_rank() * sharding + hcg.get_sharding_parallel_rank()
        return rank, hcg.get_data_parallel_world_size() * sharding
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def tensor_parallel_group():
    """fleet's model-parallel group when it spans more than one rank, else None."""
    hcg = hybrid_communicate_group()
    return hcg.get_model_parallel_group() if hcg is not None and hcg.get_model_parallel_world_size() > 1 else None


def rank_shard(size):
    """Indices of this data rank's share of `size` items, every item on exactly one data rank (no padding
    repeats, so sums over ranks are exact)."""
    rank, ranks = data_parallel_rank_and_size()
    return list(range(rank, size, ranks))


REDUCTION_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "maximum", dist.ReduceOp.MIN: "minimum"}


def all_reduce_scalars(values, op=dist.ReduceOp.SUM, what="metrics"):
    """Reduce a dict of python floats (`what`, for the watchdog's messages) over the data ranks with `op` (SUM,
    MAX or MIN); a no-op in a single process. Each batch's copies on tensor- and pipeline-parallel ranks are
    counted once."""
    if not values or not is_distributed():
        return dict(values)
    keys = sorted(values)
    stacked = paddle.to_tensor([float(values[k]) for k in keys], dtype="float64")
    if op == dist.ReduceOp.SUM:
        stacked = sum_over_data_ranks(stacked, what)
    else:
        with collective(f"the {REDUCTION_NAMES[op]} of the {what}"):
            dist.all_reduce(stacked, op=op)
    return dict(zip(keys, stacked.numpy().tolist()))


def sum_over_data_ranks(tensor, what="batch statistics"):
    """The sum of `tensor` (`what`, for the watchdog's messages) over the data ranks, each batch's copies on
    tensor- and pipeline-parallel ranks counted once (a new tensor; the input itself in a single process)."""
    if not is_distributed():
        return tensor
    total = tensor.clone()
    with collective(f"the sum of the {what}"):
        dist.all_reduce(total)
    return total / (dist.get_world_size() // data_parallel_rank_and_size()[1])


def mean_over_ranks(values, what="metrics"):
    """Average per-rank metrics over the data ranks (each holds the same number of samples)."""
    ranks = data_parallel_rank_and_size()[1]
    return {k: v / ranks for k, v in all_reduce_scalars(values, what=what).items()}


def finish_distributed_run():
    """End a multi-process run right after a final barrier, without interpreter teardown.

    Once one rank has exited and closed its sockets, a rank still tearing down its gloo process group
    can abort (exit -6, which `paddle.distributed.launch` reports as 250) although all work is done.
    Every rank has finished and flushed its files at the barrier, so leaving at once loses nothing and
    keeps the window for that race to microseconds. A no-op in a single process.
    """
    if not is_distributed():
        return
    dist.barrier()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
