"""Reward-model trainer: paddlenlp's Trainer with a pairwise loss (`loss_type`) and preference accuracy, and
the fused CPU AdamW (fused_optimizer.py), over models split by the tensor-parallel plan too (split_training.py)
or trained as pipeline stages (model_pp.py's reward pipes, through paddlenlp's pipeline loop).

Batches come from `PreferenceCollator`: the N better sequences, then the N worse ones, scored in one
forward pass of the score model.
"""

import contextlib
import functools
import itertools

import paddle
import paddle.distributed as dist
from paddle.distributed.fleet.meta_parallel import PipelineParallel
from paddlenlp.trainer import Trainer

from paddle_alignment.algos import PAIRWISE_LOSSES
from paddle_alignment.algos.pairwise import scored_pairs
from paddle_alignment.distributed import all_reduce_scalars, collective, rank_shard
from paddle_alignment.fused_optimizer import FusedOptimizerMixin
from paddle_alignment.pipeline_parallel import is_pipeline_stage, pipeline_group
from paddle_alignment.split_training import AverageSplitGradients, SplitModelMixin


def pair_objective(args):
    """(scores [2N, L], input_ids, attention_mask) -> (loss, better end scores, worse end scores) with the run's
    `loss_type` and `regularization`: the plain model's loss and the reward pipe's alike."""
    return functools.partial(scored_pairs, PAIRWISE_LOSSES.get(args.loss_type), regularization=args.regularization)


class RewardTrainer(SplitModelMixin, FusedOptimizerMixin, Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(AverageSplitGradients)
        self.objective = pair_objective(self.args)

    def pair_loss(self, model, inputs):
        """The pairwise loss and the better and worse end scores [N] of one collated batch."""
        scores = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).scores[..., 0]
        return self.objective(scores, inputs["input_ids"], inputs["attention_mask"])

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, better, worse = self.pair_loss(model, inputs)
        return (loss, {"better_scores": better, "worse_scores": worse}) if return_outputs else loss

    @paddle.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Accuracy (better scored above worse), loss, and mean/std of all end scores over the eval pairs.
        Each data rank scores its own share, every pair exactly once; the sums are added over ranks."""
        dataset = eval_dataset or self.eval_dataset
        shard = rank_shard(len(dataset))
        size = self.args.per_device_eval_batch_size
        batches = (self.data_collator([dataset[i] for i in shard[start : start + size]]) for start in range(0, len(shard), size))
        totals = {"correct": 0.0, "pairs": 0.0, "loss": 0.0, "score_sum": 0.0, "score_square_sum": 0.0}
        scored = self.scored_through_pipeline(batches) if is_pipeline_stage(self.model) else self.scored(batches)
        for loss, better, worse in scored:
            n = better.shape[0]
            scores = paddle.concat([better, worse]).astype("float64")
            totals["correct"] += float((better > worse).astype("float32").sum())
            totals["pairs"] += n
            totals["loss"] += float(loss) * n
            totals["score_sum"] += float(scores.sum())
            totals["score_square_sum"] += float((scores**2).sum())
        if is_pipeline_stage(self.model):
            totals = from_last_stage(totals)
        totals = all_reduce_scalars(totals)
        pairs = totals["pairs"]
        mean = totals["score_sum"] / (2 * pairs)
        metrics = {
            f"{metric_key_prefix}_accuracy": totals["correct"] / pairs,
            f"{metric_key_prefix}_loss": totals["loss"] / pairs,
            f"{metric_key_prefix}_reward_mean": mean,
            f"{metric_key_prefix}_reward_std": max(totals["score_square_sum"] / (2 * pairs) - mean**2, 0.0) ** 0.5,
        }
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def scored(self, batches):
        """(loss, better, worse) of each collated batch through the model."""
        self.model.eval()
        for inputs in batches:
            with self.autocast_smart_context_manager():
                yield self.pair_loss(self.model, inputs)
        self.model.train()

    def scored_through_pipeline(self, batches):
        """(loss, better, worse) of each collated batch on the last pipeline stage (nothing on the others): the
        batches run through fleet's pipeline, as many at once as a training step's micro-batches, and the
        last stage computes the objective on their scores."""
        pipeline = self.model_wrapped
        if not isinstance(pipeline, PipelineParallel):
            raise RuntimeError("a pipeline stage evaluates through fleet's pipeline, which the trainer builds when training starts")
        while group := list(itertools.islice(batches, self.args.gradient_accumulation_steps)):
            pipeline._p2p_helper.clear_meta_cache()  # as paddlenlp's prediction step: training shares the helper
            packed = self.model._prepare_pipeline_inputs_func(group)  # (the batches padded to one width)
            with micro_batches(pipeline, len(group)), self.autocast_smart_context_manager():
                outputs = pipeline.eval_batch(packed, compute_loss=False)
            pipeline._p2p_helper.clear_meta_cache()
            if pipeline.is_pipeline_last_stage():
                for scores, input_ids, attention_mask in zip(outputs, *packed[1]):
                    yield self.model.objective.evaluated(scores, input_ids, attention_mask)


@contextlib.contextmanager
def micro_batches(pipeline, count):
    """fleet's pipeline running `count` micro-batches a call meanwhile (an evaluation's last group may be
    shorter than a training step)."""
    saved, pipeline.accumulate_steps = pipeline.accumulate_steps, count
    try:
        yield
    finally:
        pipeline.accumulate_steps = saved


def from_last_stage(values):
    """The last pipeline stage's `values` (a dict of floats) on every stage of its pipeline."""
    group = pipeline_group()
    shared = [values]
    with collective("the evaluation totals from the last pipeline stage"):
        dist.broadcast_object_list(shared, src=group.ranks[-1], group=group)
    return shared[0]
