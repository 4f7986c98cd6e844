"""DPO trainer: the preference trainer (paddle_alignment/preference/trainer.py) with a pairwise loss (`loss_type`,
algos/preference.py) on each batch's N chosen and N rejected replies, and the NLL of the chosen ones
(`sft_loss_ratio`)."""

from paddle_alignment.algos import PREFERENCE_LOSSES
from paddle_alignment.algos.preference import chosen_nll
from paddle_alignment.algos.registry import call_with_options
from paddle_alignment.preference.trainer import PreferenceTrainer, mean_of

LOSS_OPTIONS = ("beta", "label_smoothing", "simpo_gamma", "dpop_lambda")


class DPOTrainer(PreferenceTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pair_loss = PREFERENCE_LOSSES.get(self.args.loss_type)
        self.length_normalized = PREFERENCE_LOSSES.traits(self.args.loss_type).length_normalized

    def batch_loss(self, batch, policy, reference_logps, inputs):
        pairs = batch.num_sequences // 2
        lengths = policy.lengths
        logps = policy.logp_means if self.length_normalized else policy.logp_sums
        reference = reference_logps / lengths if self.length_normalized else reference_logps
        chosen, rejected, ref_chosen, ref_rejected = logps[:pairs], logps[pairs:], reference[:pairs], reference[pairs:]
        options = {key: getattr(self.args, key) for key in LOSS_OPTIONS}
        preference = call_with_options(self.pair_loss, chosen, rejected, ref_chosen, ref_rejected, **options).mean()
        sft = chosen_nll(policy.logp_sums[:pairs], lengths[:pairs])
        loss = self.args.pref_loss_ratio * preference + self.args.sft_loss_ratio * sft
        chosen_rewards = self.args.beta * (chosen - ref_chosen).detach()
        rejected_rewards = self.args.beta * (rejected - ref_rejected).detach()
        metrics = {
            "rewards/chosen": mean_of(chosen_rewards),
            "rewards/rejected": mean_of(rejected_rewards),
            "rewards/accuracies": mean_of((chosen_rewards > rejected_rewards).astype("float32")),
            "rewards/margins": mean_of(chosen_rewards - rejected_rewards),
            "logps/chosen": mean_of(policy.logp_sums[:pairs].detach()),
            "logps/rejected": mean_of(policy.logp_sums[pairs:].detach()),
            "logits/chosen": (float(policy.mean_logit_sums[:pairs].sum()), float(lengths[:pairs].sum())),
            "logits/rejected": (float(policy.mean_logit_sums[pairs:].sum()), float(lengths[pairs:].sum())),
            "entropy": (float(policy.entropy_sums.sum()), float(lengths.sum())),
            "loss/preference": (float(preference) * pairs, pairs),
            "loss/sft": (float(sft) * pairs, pairs),
        }
        return loss, metrics
