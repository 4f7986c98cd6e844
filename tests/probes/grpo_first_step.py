"""The first GRPO steps (`max_steps` of them) of run_ppo on fixed rollouts, alone or under
`paddle.distributed.launch`:

    python tests/probes/grpo_first_step.py METRICS.json CONFIG.json [--key value ...]

Sampling draws different random numbers for a different batch layout, so the rollouts are fixed instead:
for each prompt the right sum and wrong ones, rewards that differ within every group. Everything after
the rollout (rewards, log-probs, advantages, the update with data-parallel gradient synchronisation,
metrics over ranks) is run_ppo's own, and so is the final policy it writes to output_dir/policy. Rank 0 writes
the last step's metrics to METRICS.json, with a digest of the policy's weights after it under "weights"; each
rank its number of response tokens, the elements of its parts of the policy's parameters and of its
optimizer's states, and how many passes took their log-probs chunk by chunk (models/head_logprobs.py), to
METRICS.json.rankN.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle  # noqa: E402

from llm.alignment.ppo import run_ppo  # noqa: E402
from paddle_alignment.checkpoints.saving import save_final_models  # noqa: E402
from paddle_alignment.distributed import finish_distributed_run, hybrid_communicate_group  # noqa: E402
from paddle_alignment.models.head_logprobs import ChunkedHeadStats  # noqa: E402
from paddle_alignment.models.tensor_parallel import local_value, whole  # noqa: E402
from paddle_alignment.offload import optimizer_tensors  # noqa: E402
from paddle_alignment.rollout import ColocatedRollout, RolloutBatch  # noqa: E402
from paddle_alignment.rollout.decode import package_rollouts  # noqa: E402
from paddle_alignment.tokens import left_pad  # noqa: E402

# Added to the right sum: the answers of one group, the first one right.
ANSWER_OFFSETS = (0, 1, -1, 10)
CHUNKED_PASSES = []  # one entry per pass of ChunkedHeadStats


def counted(apply):
    def apply_and_count(*args):
        CHUNKED_PASSES.append(1)
        return apply(*args)

    return apply_and_count


ChunkedHeadStats.apply = counted(ChunkedHeadStats.apply)


def fixed_rollouts(tokenizer, items, n):
    input_ids, prompt_mask = left_pad([item["input_ids"] for item in items for _ in range(n)], tokenizer.pad_token_id)
    answers = [str(int(item["label"]) + ANSWER_OFFSETS[i % len(ANSWER_OFFSETS)]) for item in items for i in range(n)]
    responses = [tokenizer.encode(a, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for a in answers]
    width = max(map(len, responses))
    padded = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in responses]
    return package_rollouts(tokenizer, items, n, input_ids, prompt_mask, paddle.to_tensor(padded, dtype="int64"))


class FixedRollouts(ColocatedRollout):
    """The rollout handed to the trainer: the fixed rollouts above, scored by the trainer's reward (its rollout worker's)."""

    def sample_next(self):
        items, _, version = self.pending.popleft()
        exp = fixed_rollouts(self.worker.tokenizer, items, self.worker.args.rollout_n)
        self.worker.score(exp)
        self.ready.append(RolloutBatch(exp, version, generation_seconds=0.0))


def first_steps_metrics(argv):
    """The trainer after `max_steps` steps on fixed rollouts, with its final models written; the last step's
    experience and metrics."""
    trainer = run_ppo.build_trainer(argv)
    trainer.rollout = FixedRollouts(trainer.rollout.worker)
    trainer.prepare_training()
    batches = trainer.endless_batches("train", trainer.train_dataset, trainer.args.per_device_prompt_batch_size)
    for _ in range(trainer.args.max_steps):
        exp, metrics = trainer.advance(batches)
    save_final_models(trainer.run_state())
    return trainer, exp, metrics


def weight_digest(model):
    """{parameter path: [sum, sum of absolute values]} (float64) of `model`'s weights (whole: every rank of a
    tensor-parallel group takes part)."""
    digest = {}
    for name, parameter in model.named_parameters():
        values = whole(parameter).numpy().astype("float64")
        digest[name] = [float(values.sum()), float(abs(values).sum())]
    return digest


def rank_holdings(trainer):
    """The elements this rank holds of the policy's parameters (the trained model's, and the rollout's where
    pipeline parallel keeps it apart) and of its optimizer's states, its parameter count, and its
    tensor-parallel rank."""
    states = optimizer_tensors(trainer.optimizer)
    hcg = hybrid_communicate_group()
    rollout_policy = trainer.whole_models[0] if trainer.whole_models else trainer.model
    return {
        "tensor_parallel_rank": hcg.get_model_parallel_rank() if hcg is not None else 0,
        "parameter_elements": sum(int(local_value(p).size) for p in trainer.model.parameters()),
        "rollout_parameter_elements": sum(int(local_value(p).size) for p in rollout_policy.parameters()),
        "parameters": len(trainer.model.parameters()),
        "optimizer_state_elements": sum(int(local_value(state).size) for state in states),
    }


if __name__ == "__main__":
    trainer, exp, metrics = first_steps_metrics(sys.argv[2:])
    # Under pipeline parallel the whole actor, which took the stages' weights after the update.
    weights = weight_digest(trainer.whole_models[0] if trainer.whole_models else trainer.model)
    with open(f"{sys.argv[1]}.rank{paddle.distributed.get_rank()}", "w") as f:
        json.dump({"response_tokens": float(exp.response_mask.sum()), "chunked_head_passes": len(CHUNKED_PASSES)} | rank_holdings(trainer), f)
    if trainer.is_world_process_zero():
        with open(sys.argv[1], "w") as f:
            json.dump(metrics | {"weights": weights}, f)
    finish_distributed_run()
