"""Under `paddle.distributed.launch --nproc_per_node 2`: log-probs and entropy computed from each rank's
half of the vocabulary (reduced over the group, as with tensor-parallel vocab-parallel logits) against the
full-vocabulary ones, in value and gradient. Rank 0 writes the largest differences to OUT.json.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/probes/vocab_parallel.py OUT.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from llm.alignment.ppo.algos.token_stats import entropy_from_logits, gather_logprobs  # noqa: E402
from llm.alignment.ppo.comm_utils import finish_distributed_run  # noqa: E402

BATCH, STEPS, VOCAB = 3, 5, 12


def leaf(tensor):
    tensor = tensor.detach()
    tensor.stop_gradient = False
    return tensor


def weighted_stats(logits, labels, weights, group=None):
    """Log-probs, entropy and a scalar mixing both (so one backward checks both gradients)."""
    logprobs = gather_logprobs(logits, labels, group)
    entropy = entropy_from_logits(logits, group)
    return logprobs, entropy, (logprobs * weights[0] + entropy * weights[1]).sum()


def main(output_file):
    dist.init_parallel_env()
    group = dist.new_group([0, 1])
    paddle.seed(7)  # the same logits, labels and weights on both ranks
    logits = paddle.randn([BATCH, STEPS, VOCAB]) * 4
    labels = paddle.randint(0, VOCAB, [BATCH, STEPS])
    weights = paddle.randn([2, BATCH, STEPS])
    shard = slice(group.rank * VOCAB // 2, (group.rank + 1) * VOCAB // 2)

    full = leaf(logits)
    full_logprobs, full_entropy, full_total = weighted_stats(full, labels, weights)
    full_total.backward()
    part = leaf(logits[..., shard])
    part_logprobs, part_entropy, part_total = weighted_stats(part, labels, weights, group)
    part_total.backward()

    difference = {
        "logprobs": float((full_logprobs - part_logprobs).abs().max()),
        "entropy": float((full_entropy - part_entropy).abs().max()),
        "grad": float((full.grad[..., shard] - part.grad).abs().max()),
        "grad_norm": float(part.grad.norm()),
    }
    if dist.get_rank() == 0:
        with open(output_file, "w") as f:
            json.dump(difference, f)
    finish_distributed_run()


if __name__ == "__main__":
    main(sys.argv[1])
