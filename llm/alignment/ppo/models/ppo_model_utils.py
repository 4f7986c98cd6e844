"""The RL losses computed from model outputs, shared by the plain models (ppo_trainer.py) and the
pipeline-parallel wrappers (model_pp.py), so both train on exactly the same objective."""

from dataclasses import dataclass
from typing import Callable

from llm.alignment.ppo.algos import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from llm.alignment.ppo.algos.losses import clipped_value_loss
from llm.alignment.ppo.algos.token_stats import entropy_from_logits, gather_logprobs
from llm.alignment.ppo.comm_utils import masked_mean


@dataclass(frozen=True)
class PolicyObjective:
    """Policy loss plus kl_loss_coeff x KL to the reference minus entropy_coeff x entropy, aggregated over
    response tokens with `loss_agg_mode`."""

    policy_loss_fn: Callable
    kl_fn: Callable
    aggregate: Callable
    kl_loss_coeff: float
    entropy_coeff: float
    clip_low: float
    clip_high: float

    @classmethod
    def from_args(cls, args):
        return cls(
            POLICY_LOSSES.get(args.policy_loss), KL_ESTIMATORS.get(args.kl_estimator), LOSS_AGGREGATIONS.get(args.loss_agg_mode),
            args.kl_loss_coeff, args.entropy_coeff, args.clip_range_ratio_low, args.clip_range_ratio_high,
        )

    def __call__(self, logits, labels, old_logprobs, ref_logprobs, advantages, response_mask, vocab_group=None):
        """`logits` [B, R, V] predict the response tokens `labels` [B, R] (a vocab slice with `vocab_group`);
        `old_logprobs` None means on-policy (the detached current log-probs). Returns (loss, stats)."""
        logprobs = gather_logprobs(logits, labels, vocab_group)
        old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
        token_loss, stats = self.policy_loss_fn(logprobs, old_logprobs, advantages, response_mask, self.clip_low, self.clip_high)
        policy_loss = self.aggregate(token_loss, response_mask)
        loss = policy_loss
        if ref_logprobs is not None:
            kl = self.aggregate(self.kl_fn(logprobs, ref_logprobs), response_mask)
            if self.kl_loss_coeff > 0:
                loss = loss + self.kl_loss_coeff * kl
            stats["kl"] = kl.detach()
        # The entropy is differentiated only when it is part of the loss.
        token_entropy = entropy_from_logits(logits if self.entropy_coeff > 0 else logits.detach(), vocab_group)
        if self.entropy_coeff > 0:
            loss = loss - self.entropy_coeff * self.aggregate(token_entropy, response_mask)
        stats["entropy"] = masked_mean(token_entropy.detach(), response_mask)
        stats["loss/policy_avg"] = policy_loss.detach()
        return loss, stats


@dataclass(frozen=True)
class ValueObjective:
    """The critic's clipped value loss against the returns, aggregated over response tokens."""

    aggregate: Callable
    clip_range_value: float

    @classmethod
    def from_args(cls, args):
        return cls(LOSS_AGGREGATIONS.get(args.loss_agg_mode), args.clip_range_value)

    def __call__(self, values, old_values, returns, response_mask):
        token_loss, stats = clipped_value_loss(values, old_values, returns, response_mask, self.clip_range_value)
        loss = self.aggregate(token_loss, response_mask)
        stats["loss/value_avg"] = loss.detach()
        return loss, stats
