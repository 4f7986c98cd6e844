"""Masked statistics and reductions of metrics over the data-parallel ranks (Paddle collectives only)."""

import logging
import os
import sys

import paddle
import paddle.distributed as dist


def masked_mean(values, mask, axis=None):
    mask = mask.astype(values.dtype)
    return (values * mask).sum(axis=axis) / mask.sum(axis=axis).clip(min=1.0)


def masked_whiten(values, mask, epsilon=1e-8):
    """(values - mean) / std over the positions where `mask` is 1 (population std); 0 elsewhere."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    return (values - mean) / paddle.sqrt(variance + epsilon) * mask.astype(values.dtype)


def is_distributed():
    return dist.is_initialized() and dist.get_world_size() > 1


def rank_shard(size):
    """Indices of this rank's share of `size` items, every item on exactly one rank (no padding repeats,
    so sums over ranks are exact)."""
    if not is_distributed():
        return list(range(size))
    return list(range(dist.get_rank(), size, dist.get_world_size()))


def all_reduce_scalars(values, op=dist.ReduceOp.SUM):
    """Reduce a dict of python floats over all ranks with `op`; a no-op in a single process."""
    if not values or not is_distributed():
        return dict(values)
    keys = sorted(values)
    stacked = paddle.to_tensor([float(values[k]) for k in keys], dtype="float64")
    dist.all_reduce(stacked, op=op)
    return dict(zip(keys, stacked.numpy().tolist()))


def mean_over_ranks(values):
    """Average per-rank metrics (each rank holds the same number of samples)."""
    if not is_distributed():
        return dict(values)
    world = dist.get_world_size()
    return {k: v / world for k, v in all_reduce_scalars(values).items()}


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
