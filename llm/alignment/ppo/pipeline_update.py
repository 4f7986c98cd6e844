"""The update of an RL run whose actor (and critic) train as fleet pipeline stages (models/model_pp.py).

Each optimizer step runs `gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` rows
through fleet's 1F1B schedule (`forward_backward_pipeline`), the policy and value objectives on the last
stage, then steps as the trainer's update does (optimizer_step.py: the gradient norm over every stage).
Each micro-batch's loss is its share of its step's loss over every data rank (the step's LossScale travels
with its labels), so the gradients, norms and statistics are those of the update in one process. After
the update the whole models the rollout runs on take the stages' weights (pipeline_parallel.move_weights).
"""

import time
from dataclasses import dataclass

import numpy as np

from llm.alignment.ppo.models.pp_model_utils import (
    loss_scale_entry,
    micro_batch_groups,
    policy_micro_batch,
    value_micro_batch,
)
from paddle_alignment.optimizer_step import step_optimizer
from paddle_alignment.pipeline_parallel import check_same_rows, move_weights, pipeline_group
from paddle_alignment.update_metrics import UpdateMetrics


@dataclass
class TrainedPipe:
    """One pipeline-trained model: its stage (`pipe`), fleet's PipelineParallel over it (`wrapped`), the
    optimizer and schedule of its parameters, the whole model the rollout runs on, and how a micro-batch of
    the experience is packed for it (policy_micro_batch / value_micro_batch)."""

    pipe: object
    wrapped: object
    optimizer: object
    lr_scheduler: object
    whole: object
    micro_batch_of: object
    norm_name: str


class PipelineUpdate:
    def __init__(self, args, policy, critic=None):
        self.args = args
        self.parts = [policy] + ([critic] if critic is not None else [])

    @classmethod
    def policy_part(cls, pipe, wrapped, optimizer, lr_scheduler, whole):
        return TrainedPipe(pipe, wrapped, optimizer, lr_scheduler, whole, policy_micro_batch, "grad_norm")

    @classmethod
    def critic_part(cls, pipe, wrapped, optimizer, lr_scheduler, whole):
        return TrainedPipe(pipe, wrapped, optimizer, lr_scheduler, whole, value_micro_batch, "critic_grad_norm")

    def update(self, exp, loss_scales):
        """The update of `exp`; `loss_scales(response_mask, steps)` gives each optimizer step's LossScale (the
        trainer's). Returns the metrics of the trainer's update."""
        args = self.args
        check_same_rows(exp.input_ids)
        size, accumulate = args.per_device_train_batch_size, args.gradient_accumulation_steps
        groups = [
            group for _ in range(args.update_iters)
            for group in micro_batch_groups(len(exp), size, accumulate, args.dataloader_drop_last)
        ]
        steps = [[row for start, end in group for row in range(start, end)] for group in groups]
        statistics, grad_norms = UpdateMetrics(), {part.norm_name: [] for part in self.parts}
        for group, scale in zip(groups, loss_scales(exp.trained_mask, steps)):
            per_part = [self.step(part, exp, group, scale, grad_norms[part.norm_name]) for part in self.parts]
            for stats in zip(*per_part):  # one merged dict per micro-batch, on the last stage
                statistics.add({key: value for part_stats in stats for key, value in part_stats.items()})
        group = pipeline_group()
        statistics.share_from(group, group.ranks[-1])
        metrics = statistics.reduced(len(steps))
        metrics |= {name: float(np.mean(norms)) for name, norms in grad_norms.items()}
        metrics["update_padding_ratio"] = exp.input_ids.size / max(float(exp.attention_mask.sum()), 1.0)
        return metrics

    def step(self, part, exp, group, scale, grad_norms):
        """One optimizer step of `part` over the micro-batches `group` (row ranges); returns the last stage's
        statistics of each micro-batch (none elsewhere)."""
        micro_batches = [
            dict(part.micro_batch_of(exp.select(start, end)), loss_scale=loss_scale_entry(scale, end - start, len(group)))
            for start, end in group
        ]
        part.wrapped.train()
        part.wrapped.forward_backward_pipeline(part.pipe._prepare_pipeline_inputs_func(micro_batches))
        grad_norms.append(step_optimizer(part.pipe, part.optimizer, part.lr_scheduler))
        return part.pipe.pipeline_loss.pop_stats()

    def move_weights(self):
        """The whole models take the stages' weights; returns the seconds it took."""
        started = time.time()
        for part in self.parts:
            move_weights(part.pipe, part.whole)
        return time.time() - started
