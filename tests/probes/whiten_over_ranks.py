"""Under `paddle.distributed.launch --nproc_per_node 2`: REINFORCE++ and GAE advantages of each rank's half
of one batch, whitened over both ranks (run_ppo's `reduce_sum=sum_over_data_ranks`). Each rank writes its
rows to OUT.json.rankN, with the whole batch's inputs, for the test to whiten with NumPy.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/probes/whiten_over_ranks.py OUT.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS  # noqa: E402
from paddle_alignment.distributed import finish_distributed_run, sum_over_data_ranks  # noqa: E402

ROWS, STEPS = 6, 5


def main(output_file):
    dist.init_parallel_env()
    paddle.seed(11)  # the same whole batch on both ranks
    rewards = paddle.randn([ROWS]) * 3
    values = paddle.randn([ROWS, STEPS])
    lengths = paddle.to_tensor([5, 5, 4, 1, 2, 1])  # rank 0 holds 14 tokens, rank 1 holds 4
    mask = (paddle.arange(STEPS).unsqueeze(0) < lengths.unsqueeze(1)).astype("float32")
    rows = slice(dist.get_rank() * ROWS // 2, (dist.get_rank() + 1) * ROWS // 2)
    reinforce = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(rewards[rows], mask[rows], reduce_sum=sum_over_data_ranks)
    gae, _ = ADVANTAGE_ESTIMATORS.get("ppo")(rewards[rows], mask[rows], values[rows], reduce_sum=sum_over_data_ranks)
    record = {
        "rewards": rewards.numpy().tolist(), "values": values.numpy().tolist(), "mask": mask.numpy().tolist(),
        "reinforce_plus_plus": reinforce.numpy().tolist(), "gae": gae.numpy().tolist(),
    }
    with open(f"{output_file}.rank{dist.get_rank()}", "w") as f:
        json.dump(record, f)
    finish_distributed_run()


if __name__ == "__main__":
    main(sys.argv[1])
