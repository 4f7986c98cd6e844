"""KTO trainer: the preference trainer (paddle_alignment/preference/trainer.py) with an unpaired loss (`loss_type`,
algos/preference.py) on each batch's responses, desirable or not, against the KL baseline that the batch's
mismatched (prompt, other row's response) sequences estimate."""

import paddle

from paddle_alignment.algos import UNPAIRED_PREFERENCE_LOSSES
from paddle_alignment.algos.preference import kl_baseline
from paddle_alignment.distributed import mean_over_data_ranks
from paddle_alignment.preference.trainer import PreferenceTrainer, mean_of


def kl_over_ranks(kl):
    return mean_over_data_ranks(kl.reshape([1]), "the KL baseline")[0]


class KTOTrainer(PreferenceTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unpaired_loss = UNPAIRED_PREFERENCE_LOSSES.get(self.args.loss_type)
        self.uses_kl = UNPAIRED_PREFERENCE_LOSSES.traits(self.args.loss_type).kl_baseline

    def batch_loss(self, batch, policy, reference_logps, inputs):
        count = batch.num_sequences // 2
        logps = policy.logp_sums
        responses, kl_responses = logps[:count], logps[count:]
        reference, kl_reference = reference_logps[:count], reference_logps[count:]
        # Training averages the baseline over the data ranks (TRL); evaluation takes each batch's own, as the ranks'
        # shares of the held-out rows may make different numbers of batches.
        over_ranks = kl_over_ranks if self.model.training else None
        kl = kl_baseline(kl_responses, kl_reference, over_ranks) if self.uses_kl else paddle.zeros([])
        desirable = inputs["desirable"]
        good, bad = paddle.nonzero(desirable).flatten(), paddle.nonzero(~desirable).flatten()

        def rows(values, index):
            return paddle.gather(values, index) if index.shape[0] else values[:0]

        losses = self.unpaired_loss(
            rows(responses, good), rows(reference, good), rows(responses, bad), rows(reference, bad), kl,
            beta=self.args.beta, desirable_weight=self.args.desirable_weight, undesirable_weight=self.args.undesirable_weight,
        )
        rewards = self.args.beta * (responses - reference).detach()
        chosen, rejected = rows(rewards, good), rows(rewards, bad)
        metrics = {
            "rewards/chosen": mean_of(chosen),
            "rewards/rejected": mean_of(rejected),
            "logps/chosen": mean_of(rows(responses, good).detach()),
            "logps/rejected": mean_of(rows(responses, bad).detach()),
            "kl": (float(kl), 1),
            "entropy": (float(policy.entropy_sums[:count].sum()), float(policy.lengths[:count].sum())),
        }
        return losses.mean(), metrics
