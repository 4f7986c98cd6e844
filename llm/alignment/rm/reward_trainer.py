"""Reward-model trainer: paddlenlp's Trainer with a pairwise loss (`loss_type`) and preference accuracy, and
the fused CPU AdamW (fused_optimizer.py), over models split by the tensor-parallel plan too (split_training.py).

Batches come from `PreferenceCollator`: the N better sequences, then the N worse ones, scored in one
forward pass of the score model.
"""

import paddle
from paddlenlp.trainer import Trainer

from paddle_alignment.algos import PAIRWISE_LOSSES
from paddle_alignment.algos.pairwise import end_scores
from paddle_alignment.distributed import all_reduce_scalars, rank_shard
from paddle_alignment.fused_optimizer import FusedOptimizerMixin
from paddle_alignment.split_training import AverageSplitGradients, SplitModelMixin


class RewardTrainer(SplitModelMixin, FusedOptimizerMixin, Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(AverageSplitGradients)
        self.pairwise_loss = PAIRWISE_LOSSES.get(self.args.loss_type)

    def pair_loss(self, model, inputs):
        """The pairwise loss and the better and worse end scores [N] of one collated batch."""
        scores = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).scores[..., 0]
        n = scores.shape[0] // 2
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        loss = self.pairwise_loss(
            scores[:n], scores[n:], ids[:n], ids[n:], mask[:n], mask[n:], regularization=self.args.regularization
        )
        ends = end_scores(scores, mask)
        return loss, ends[:n], ends[n:]

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, better, worse = self.pair_loss(model, inputs)
        return (loss, {"better_scores": better, "worse_scores": worse}) if return_outputs else loss

    @paddle.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Accuracy (better scored above worse), loss, and mean/std of all end scores over the eval pairs.
        Each rank scores its own share, every pair exactly once; the sums are added over ranks."""
        dataset = eval_dataset or self.eval_dataset
        shard = rank_shard(len(dataset))
        size = self.args.per_device_eval_batch_size
        self.model.eval()
        totals = {"correct": 0.0, "pairs": 0.0, "loss": 0.0, "score_sum": 0.0, "score_square_sum": 0.0}
        for start in range(0, len(shard), size):
            inputs = self.data_collator([dataset[i] for i in shard[start : start + size]])
            with self.autocast_smart_context_manager():
                loss, better, worse = self.pair_loss(self.model, inputs)
            n = better.shape[0]
            scores = paddle.concat([better, worse]).astype("float64")
            totals["correct"] += float((better > worse).astype("float32").sum())
            totals["pairs"] += n
            totals["loss"] += float(loss) * n
            totals["score_sum"] += float(scores.sum())
            totals["score_square_sum"] += float((scores**2).sum())
        self.model.train()
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
