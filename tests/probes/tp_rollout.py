"""Greedy and sampled rollouts of run_ppo's actor on the first eval prompts, alone or under
`paddle.distributed.launch`:

    python tests/probes/tp_rollout.py OUT.json CONFIG.json [--key value ...]

Rank 0 writes the response token ids (sampled ones drawn after `paddle.seed(7)`), whether the actor's weights are split over a tensor-parallel group,
and the warnings the rollout engine logged (a fallback to generate() among them).
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
from paddle_alignment.distributed import finish_distributed_run  # noqa: E402
from paddle_alignment.models.tensor_parallel import is_tensor_parallel  # noqa: E402
from paddle_alignment.rollout import decode as infer_utils  # noqa: E402


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


if __name__ == "__main__":
    warnings = Collect()
    logging.getLogger(infer_utils.__name__).addHandler(warnings)
    trainer = run_ppo.build_trainer(sys.argv[2:])
    items = [trainer.eval_dataset[i] for i in range(16)]
    tokens = {}
    for name, greedy in [("greedy", True), ("sampled", False)]:
        paddle.seed(7)
        sampling = infer_utils.SamplingConfig.from_args(trainer.args, greedy=greedy)
        exp = infer_utils.generate_rollouts(trainer.model, trainer.tokenizer, items, 1 if greedy else 4, sampling, trainer.args.use_fusemt)
        tokens[name] = exp.input_ids[:, exp.prompt_len :].numpy().tolist()
    if paddle.distributed.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({
                **tokens,
                "tensor_parallel": is_tensor_parallel(trainer.model),
                "warnings": warnings.messages,
            }, f)
    finish_distributed_run()
