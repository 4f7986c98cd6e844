"""Reductions over the data-parallel ranks (Paddle collectives only).

Under fleet hybrid parallel, the ranks of one tensor- or pipeline-parallel group share a batch: only
data-parallel and sharding ranks hold different data. Sums over all ranks are therefore divided by the
number of copies of each batch, and data is split over the data ranks only.
"""

import contextlib
import logging
import os
import socket
import sys

import paddle
import paddle.distributed as dist
from paddle.distributed import collective as paddle_collective
from paddle.distributed import fleet

from paddle_alignment import watchdog


def rendezvous_each_gloo_group_apart():
    """Make every gloo process group created from now on meet its peers in a TCP store of its own.

    Paddle 3.3's `ProcessGroupGloo` connects its gloo context through the launch's one TCP store under the
    keys "0", "1", ... with no prefix per group (process_group_gloo.cc; its comm context does prefix the
    group id). A rank creating a group can then read a peer's address left there by an earlier group, or
    written at the same moment by a group of the same size beside it (fleet's data-parallel groups), and
    the group fails to form: `gloo/transport/tcp/pair.cc:784 ... Connection refused`, a gloo TIMEOUT or a
    hang. Measured under 4 processes creating 18 groups (tests/probes/gloo_groups.py): every run failed;
    with a store per group, none did. The first rank of each group opens the group's store on a free
    port and publishes the port in the launch's store under the group's id, which all members share.
    Groups of other backends (NCCL on GPUs) and the global group are left as Paddle makes them. Called
    before fleet or the parallel environment is initialised; calling it again changes nothing."""
    create = paddle_collective._new_process_group_impl
    if getattr(create, "rendezvous_apart", False):
        return

    def create_with_own_store(backend, store, rank, world_size, group_name, pg_options, group_id=0, **options):
        if backend == "gloo" and group_id != 0:
            store = group_store(store, rank, world_size, group_id)
        return create(backend, store, rank, world_size, group_name, pg_options, group_id, **options)

    create_with_own_store.rendezvous_apart = True
    paddle_collective._new_process_group_impl = create_with_own_store


def group_store(launch_store, rank, world_size, group_id):
    """A TCP store for the members of process group `group_id`, served by its first rank at its launch
    address. The address is published before the store opens: the server waits for every member."""
    key = f"paddle_alignment/group_store/{group_id}"
    if rank == 0:
        host = os.environ.get("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0").rsplit(":", 1)[0]
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        launch_store.set(key, f"{host}:{port}".encode())
        return paddle.base.core.TCPStore(host, port, True, world_size)
    host, port = bytes(launch_store.get(key)).decode().rsplit(":", 1)
    return paddle.base.core.TCPStore(host, int(port), False, world_size)


def is_distributed():
    return dist.is_initialized() and dist.get_world_size() > 1


def collective(what):
    """A context in which this rank waits on the other ranks for `what`, under the watchdog's deadline (a
    no-op in a single process)."""
    if not is_distributed():
        return contextlib.nullcontext()
    return watchdog.guarded("collective", f"{what} over {dist.get_world_size()} ranks")


def barrier():
    """Every rank waits here for the others (nothing to wait for in one process)."""
    if is_distributed():
        with collective("a barrier"):
            dist.barrier()


def hybrid_communicate_group():
    """fleet's hybrid communicate group once fleet hybrid parallel is initialised, else None."""
    return getattr(fleet.fleet, "_hcg", None)


# Sharding stage 3 steps each sliced parameter as a new parameter named this prefix + the parameter's name.
SLICE_PREFIX = "slice@"


def sliced_by_sharding(tensor):
    """Whether sharding stage 3 (paddle's group_sharded_parallel) holds `tensor` as a slice (`fw_storage`), its
    whole value gathered only within its layer's forward and backward: code that reads it anywhere else finds
    it empty."""
    return hasattr(tensor, "fw_storage")


def holds_sliced_weights(model):
    """Whether sharding stage 3 holds any of `model`'s parameters as a slice (sliced_by_sharding)."""
    return any(sliced_by_sharding(parameter) for parameter in model.parameters())


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
    return total / copies_of_each_batch()


def mean_over_data_ranks(tensor, what="batch statistics"):
    """The mean of `tensor` (`what`, for the watchdog's messages) over the data ranks (sum_over_data_ranks / ranks)."""
    return sum_over_data_ranks(tensor, what) / data_parallel_rank_and_size()[1]


def copies_of_each_batch():
    """How many ranks hold each data rank's batch: its tensor- and pipeline-parallel ranks (1 without them)."""
    return dist.get_world_size() // data_parallel_rank_and_size()[1]


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
