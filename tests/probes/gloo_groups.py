"""Under `paddle.distributed.launch --nproc_per_node 4`: the process groups of fleet's hybrid layouts,
created one after another and side by side (the data-parallel groups [0, 2] and [1, 3] at once), each
checked by an all-reduce. Rank 0 writes the sums each group gave to OUT.json. With `paddle` as the second
argument the groups are made by Paddle alone, without `rendezvous_each_gloo_group_apart`.

    python -m paddle.distributed.launch --nproc_per_node 4 tests/probes/gloo_groups.py OUT.json [paddle]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddle_alignment.distributed import finish_distributed_run, rendezvous_each_gloo_group_apart  # noqa: E402

# fleet's groups at TP4, at TP2 x DP2 (model- then data-parallel groups), and whole again: 3 rounds.
GROUPS = [[0, 1, 2, 3], [0, 1], [2, 3], [0, 2], [1, 3], [0, 1, 2, 3]] * 3


def main(output_file, how="own stores"):
    if how != "paddle":
        rendezvous_each_gloo_group_apart()
    dist.init_parallel_env()
    rank = dist.get_rank()
    sums = []
    for ranks in GROUPS:
        group = dist.new_group(ranks)
        total = paddle.to_tensor([0.0 if rank not in ranks else float(rank + 1)])
        if rank in ranks:
            dist.all_reduce(total, group=group)
        sums.append(total.item())
    totals = paddle.to_tensor(sums)
    dist.all_reduce(totals, op=dist.ReduceOp.MAX)  # each group's sum, whichever ranks it holds
    if rank == 0:
        with open(output_file, "w") as f:
            json.dump({"groups": GROUPS, "sums": totals.numpy().tolist()}, f)
    finish_distributed_run()


if __name__ == "__main__":
    main(*sys.argv[1:])
