"""paddlenlp's Trainer for offline preference alignment, shared by DPO (llm/alignment/dpo) and KTO
(llm/alignment/kto): each micro-batch is one packed forward of the policy (models/packed_sequences.py) and the
reference's log-probs (reference.py); a subclass turns them into its loss and metrics (`batch_loss`).

A metric is a (sum, count) pair of a micro-batch (rewards over its pairs, logits over its tokens), added up until
the next log and over the data ranks, and logged as their ratio under TRL's names (rewards/chosen,
logps/rejected, ...); evaluation scores every held-out group exactly once the same way.
"""

import os
from collections import defaultdict

import paddle
from paddlenlp.trainer import Trainer, TrainerCallback
from paddlenlp.trainer.trainer_utils import PREFIX_CHECKPOINT_DIR

from paddle_alignment.distributed import all_reduce_scalars, rank_shard
from paddle_alignment.fused_optimizer import FusedOptimizerMixin
from paddle_alignment.models.packed_sequences import PackedBatch, packed_sequence_stats
from paddle_alignment.preference.reference import save_reference_weights
from paddle_alignment.split_training import AverageSplitGradients, SplitModelMixin

PACKED_FIELDS = tuple(PackedBatch.__dataclass_fields__)


class ReferenceUpdates(TrainerCallback):
    """TR-DPO: every ref_model_update_steps optimizer steps the reference takes in the policy's weights; each
    checkpoint keeps the reference it has reached, for the resume."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_update_steps == 0:
            self.trainer.reference.mix_in(self.trainer.model, args.ref_model_mixup_alpha)

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        save_reference_weights(self.trainer.reference.model, folder)


class PreferenceTrainer(SplitModelMixin, FusedOptimizerMixin, Trainer):
    def __init__(self, *args, reference, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(AverageSplitGradients)
        self.reference = reference
        if self.args.ref_model_update_steps > 0:
            self.add_callback(ReferenceUpdates(self))
        self.stored = defaultdict(float)

    def batch_loss(self, batch, policy, reference_logps, inputs):
        """(loss, {metric: (sum, count)}) of one packed batch: `policy` its SequenceStats, `reference_logps` [S]."""
        raise NotImplementedError

    def loss_and_metrics(self, model, inputs):
        batch = PackedBatch(**{name: inputs[name] for name in PACKED_FIELDS})
        reference_logps = inputs.get("reference_logps")
        if reference_logps is None:
            reference_logps = self.reference.logp_sums(model, batch)
        policy = packed_sequence_stats(model, batch, self.args.logprob_chunk_tokens)
        return self.batch_loss(batch, policy, reference_logps.astype("float32"), inputs)

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, metrics = self.loss_and_metrics(model, inputs)
        add_metrics(self.stored, metrics)
        return (loss, metrics) if return_outputs else loss

    def log(self, logs, **kwargs):
        """paddlenlp's log, with the training metrics since the last one (over the data ranks)."""
        if self.stored and not any(key.startswith("eval_") for key in logs):
            logs = {**logs, **metric_values(self.stored)}
            self.stored.clear()
        super().log(logs, **kwargs)

    @paddle.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """The loss and metrics over the held-out items, each scored once (each data rank its share, the sums
        weighted by the batch's groups and added over the ranks)."""
        dataset = eval_dataset or self.eval_dataset
        shard = rank_shard(len(dataset))
        size = self.args.per_device_eval_batch_size
        self.model.eval()
        totals = defaultdict(float)
        for start in range(0, len(shard), size):
            items = [dataset[i] for i in shard[start : start + size]]
            with self.autocast_smart_context_manager():
                loss, metrics = self.loss_and_metrics(self.model, self.data_collator(items))
            add_metrics(totals, {"loss": (float(loss) * len(items), len(items)), **metrics})
        self.model.train()
        results = {f"{metric_key_prefix}_{name}": value for name, value in metric_values(totals).items()}
        self.log(results)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, results)
        return results


def add_metrics(totals, metrics):
    """Add a batch's {name: (sum, count)} into `totals` ({"name/sum": ..., "name/count": ...})."""
    for name, (total, count) in metrics.items():
        totals[f"{name}/sum"] += float(total)
        totals[f"{name}/count"] += float(count)


def metric_values(totals):
    """{name: sum / count} of `totals` added over the data ranks, for the metrics with a count."""
    summed = all_reduce_scalars(dict(totals), what="preference metrics")
    names = sorted({key.rsplit("/", 1)[0] for key in summed})
    return {name: summed[f"{name}/sum"] / summed[f"{name}/count"] for name in names if summed[f"{name}/count"] > 0}


def mean_of(values):
    """(sum, count) of a tensor's values."""
    return float(values.sum()), values.shape[0]
