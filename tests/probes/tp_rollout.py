"""Greedy and sampled rollouts of run_ppo's actor on the first eval prompts, alone or under
`paddle.distributed.launch`:

    python tests/probes/tp_rollout.py OUT.json CONFIG.json [--key value ...]

Each data rank takes its share of 16 eval prompts (all of them in one process). Rank 0 writes to OUT.json the
prompts' indices, the response token ids without their padding (sampled ones drawn after `paddle.seed(7)`), whether the actor's
weights are split over a tensor-parallel group, and the warnings the decode loop logged (a fallback to
generate() among them); every rank writes the same of its own to OUT.json.rankN.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle  # noqa: E402

from llm.alignment.ppo import run_ppo  # noqa: E402
from paddle_alignment.distributed import finish_distributed_run, rank_shard  # noqa: E402
from paddle_alignment.models.tensor_parallel import is_tensor_parallel  # noqa: E402
from paddle_alignment.rollout import decode as infer_utils  # noqa: E402


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def strip_padding(tokens, pad):
    """A response without the padding after it (its batch pads responses to the longest)."""
    while tokens and tokens[-1] == pad:
        tokens = tokens[:-1]
    return tokens


if __name__ == "__main__":
    warnings = Collect()
    logging.getLogger(infer_utils.__name__).addHandler(warnings)
    trainer = run_ppo.build_trainer(sys.argv[2:])
    indices = rank_shard(16)
    items = [trainer.eval_dataset[i] for i in indices]
    tokens = {}
    for name, greedy in [("greedy", True), ("sampled", False)]:
        paddle.seed(7)
        sampling = infer_utils.SamplingConfig.from_args(trainer.args, greedy=greedy)
        exp = infer_utils.generate_rollouts(trainer.model, trainer.tokenizer, items, 1 if greedy else 4, sampling, trainer.args.use_fusemt)
        pad = trainer.tokenizer.pad_token_id
        tokens[name] = [strip_padding(row, pad) for row in exp.input_ids[:, exp.prompt_len :].numpy().tolist()]
    record = {**tokens, "indices": indices, "tensor_parallel": is_tensor_parallel(trainer.model), "warnings": warnings.messages}
    rank = paddle.distributed.get_rank()
    for path in [f"{sys.argv[1]}.rank{rank}"] + ([sys.argv[1]] if rank == 0 else []):
        with open(path, "w") as f:
            json.dump(record, f)
    finish_distributed_run()
