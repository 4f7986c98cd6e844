"""Parameters of the algorithm (advantages, policy loss, KL, clipping, aggregation, DAPO's dynamic sampling,
rollout correction) and of the actor's learning-rate schedule, each checked against its registry."""

from dataclasses import dataclass, field
from typing import Optional

from paddlenlp.utils.log import logger

from paddle_alignment.algos import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LR_SCHEDULES,
    POLICY_LOSSES,
    ROLLOUT_CORRECTIONS,
)
from paddle_alignment.config.checks import check_choices, check_non_negative


@dataclass
class AlgorithmArguments:
    """Parameters that control the algorithm: advantages, policy loss, KL, clipping, aggregation and DAPO's dynamic sampling."""

    rl_algorithm: str = field(
        default="ppo", metadata={"help": "Advantage estimator (PaddleNLP's default ppo): " + ", ".join(ADVANTAGE_ESTIMATORS.names())}
    )
    update_iters: int = field(default=1, metadata={"help": "Passes over each rollout batch."})
    policy_loss: str = field(default="ppo_clip", metadata={"help": "Policy loss: " + ", ".join(POLICY_LOSSES.names()) + " (ppo_clip: per-token ratio; gspo, gmpo: per-sequence ratio, always aggregated with seq-mean-token-mean; cispo: clipped, detached IS weight times log-prob; sapo: soft gate instead of the clip)."})
    sapo_tau_pos: float = field(default=1.0, metadata={"help": "sapo: gate temperature of tokens with positive advantage (the paper's 1.0)."})
    sapo_tau_neg: float = field(default=1.05, metadata={"help": "sapo: gate temperature of tokens with negative advantage (the paper's 1.05)."})
    pg_loss_coeff: float = field(default=1.0, metadata={"help": "Weight of the policy-gradient loss."})
    entropy_coeff: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus (0: off)."})
    clip_range_ratio: float = field(default=0.2, metadata={"help": "PPO ratio clip, both sides unless _low/_high are given."})
    clip_range_ratio_low: Optional[float] = field(default=None, metadata={"help": "Lower clip: ratio >= 1 - this (cispo: 1 sets no lower bound; gmpo: log-ratio >= -this)."})
    clip_range_ratio_high: Optional[float] = field(default=None, metadata={"help": "Upper clip: ratio <= 1 + this (DAPO clip-higher; gmpo: log-ratio <= this)."})
    clip_ratio_c: float = field(
        default=3.0,
        metadata={"help": "Dual-clip PPO (ppo_clip): the loss of a negative-advantage token is at most -A x this (verl's key and default; 0: off)."},
    )
    loss_agg_mode: Optional[str] = field(
        default=None,
        metadata={
            "help": "Loss aggregation over the optimizer step's tokens: " + ", ".join(LOSS_AGGREGATIONS.names())
            + " (default token-mean; gspo and gmpo always seq-mean-token-mean; seq-mean-token-sum-norm: Dr.GRPO's, divided by max_dec_len)."
        },
    )
    kl_loss_coeff: float = field(default=0.001, metadata={"help": "Weight of the KL-to-reference loss (0 disables the reference model)."})
    kl_estimator: str = field(default="k3", metadata={"help": "KL estimator of the KL loss and the logged kl: k1, k2 or k3 (k3 clamped as verl does: log-ratio to +-20, estimate to +-10)."})
    kl_coeff: float = field(
        default=0.02,
        metadata={"help": "Weight of the KL penalty in the token rewards (ppo, reinforce_plus_plus; other algorithms ignore it, with a warning)."},
    )
    reward_kl_estimator: str = field(default="k1", metadata={"help": "KL estimator of the KL penalty in the token rewards: k1 (verl's and PaddleNLP's default), k2 or k3."})
    gamma: float = field(default=1.0, metadata={"help": "Discount of the token returns (ppo, reinforce_plus_plus)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (ppo)."})
    normalize_advantage: bool = field(default=False, metadata={"help": "Whiten GAE advantages over valid tokens (ppo; off for grpo, as in PaddleNLP)."})
    norm_adv_by_std_in_grpo: bool = field(default=True, metadata={"help": "Divide group advantages by the group std (False: Dr.GRPO)."})
    ptx_coeff: float = field(default=0.0, metadata={"help": "Weight of the language-model loss on ptx_datasets (ppo)."})
    dynamic_sampling: bool = field(
        default=False, metadata={"help": "DAPO dynamic sampling: drop groups of equal rewards and generate more batches to fill the step."}
    )
    max_gen_batches: int = field(default=32, metadata={"help": "With dynamic_sampling: at most this many generated batches per step."})
    rollout_correction: str = field(
        default="",
        metadata={"help": "Weights of the policy loss for the gap between the sampler's and the trainer's log-probs (docs/rollout_correction.md): "
                  + ", ".join(ROLLOUT_CORRECTIONS.names()) + ", or empty: none (the rollout_corr/* metrics are logged either way)."},
    )
    rollout_is_threshold: float = field(
        default=2.0, metadata={"help": "rollout_correction: the upper bound of the importance ratio pi_old / pi_rollout (the cap of token_tis and sequence_tis; the upper bound kept by sequence_mis, geometric_mask and icepop)."}
    )
    rollout_is_threshold_lower: Optional[float] = field(
        default=None, metadata={"help": "rollout_correction: the lower bound kept by sequence_mis, geometric_mask and icepop (default 1 / rollout_is_threshold)."}
    )

    @property
    def kl_in_reward(self):
        """The token rewards carry a KL penalty, which needs the rollout policy's and the reference's log-probs."""
        return ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).kl_in_reward and self.kl_coeff > 0

    @property
    def uses_critic(self):
        return ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).critic

    @property
    def uses_reference_model(self):
        return self.kl_loss_coeff > 0 or self.kl_in_reward

    def resolve_loss_agg_mode(self):
        """An unset loss_agg_mode is token-mean; a policy loss defined with its own aggregation (gspo, gmpo:
        per sequence) always gets it, with a warning when the config asks for another."""
        if self.policy_loss not in POLICY_LOSSES.names():
            return  # validate_rl names the key
        required = POLICY_LOSSES.traits(self.policy_loss).loss_agg_mode
        if required and self.loss_agg_mode not in (None, required):
            logger.warning(
                f"policy_loss={self.policy_loss} is defined per sequence: loss_agg_mode={self.loss_agg_mode!r} "
                f"is replaced by {required!r} (its paper's mean over sequences, as in verl)"
            )
        self.loss_agg_mode = required or self.loss_agg_mode or "token-mean"


    def validate_algorithm(self):
        if self.clip_range_ratio_low is None:
            self.clip_range_ratio_low = self.clip_range_ratio
        if self.clip_range_ratio_high is None:
            self.clip_range_ratio_high = self.clip_range_ratio
        self.resolve_loss_agg_mode()
        choices = {
            "rl_algorithm": ADVANTAGE_ESTIMATORS,
            "kl_estimator": KL_ESTIMATORS,
            "reward_kl_estimator": KL_ESTIMATORS,
            "policy_loss": POLICY_LOSSES,
            "loss_agg_mode": LOSS_AGGREGATIONS,
        }
        if self.rollout_correction:
            choices["rollout_correction"] = ROLLOUT_CORRECTIONS
        check_choices(self, choices)
        self.validate_rollout_correction()
        for key in ("update_iters", "max_gen_batches"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.clip_ratio_c and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c={self.clip_ratio_c} must be > 1 (dual clip caps the loss at -A x clip_ratio_c), or 0 for off")
        if ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).group_baseline and self.rollout_n < 2:
            raise ValueError(
                f"rollout_n={self.rollout_n}: {self.rl_algorithm} compares samples of one prompt, so it needs rollout_n >= 2"
            )
        check_non_negative(self, [
            "clip_range_ratio_low", "clip_range_ratio_high", "kl_loss_coeff", "entropy_coeff", "kl_coeff", "ptx_coeff",
            "pg_loss_coeff", "clip_ratio_c",
        ])
        if self.clip_range_ratio_low >= 1 and self.policy_loss != "cispo":
            raise ValueError(f"clip_range_ratio_low={self.clip_range_ratio_low} must be < 1 (ratios are positive; only cispo takes 1 or more: no lower bound)")
        if self.policy_loss == "sapo" and not (self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0):
            raise ValueError(f"sapo_tau_pos={self.sapo_tau_pos} and sapo_tau_neg={self.sapo_tau_neg} must be > 0 (the gate divides by them)")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if self.dynamic_sampling and self.rollout_n < 2:
            raise ValueError("dynamic_sampling filters groups of samples, so it needs rollout_n >= 2")

    def validate_rollout_correction(self):
        if not self.rollout_is_threshold > 0:
            raise ValueError(f"rollout_is_threshold must be > 0 (a bound of the ratio pi_old / pi_rollout), got {self.rollout_is_threshold}")
        if self.rollout_is_threshold_lower is None:
            self.rollout_is_threshold_lower = 1.0 / self.rollout_is_threshold
        if not 0 <= self.rollout_is_threshold_lower <= self.rollout_is_threshold:
            raise ValueError(
                f"rollout_is_threshold_lower={self.rollout_is_threshold_lower} must lie in [0, rollout_is_threshold={self.rollout_is_threshold}]"
            )


@dataclass
class ScheduleArguments:
    """Parameters that control the actor's learning-rate schedule, beside paddlenlp's learning_rate, lr_scheduler_type and warm-up keys."""

    min_learning_rate: float = field(default=0.0, metadata={"help": "The schedule decays to this learning rate."})
    decay_steps: Optional[int] = field(default=None, metadata={"help": "RL steps over which the schedule decays to min_learning_rate (default max_steps)."})

    def validate_schedule(self):
        check_choices(self, {"lr_scheduler_type": LR_SCHEDULES})
        check_non_negative(self, ["learning_rate", "warmup_steps"])
        if self.decay_steps is not None and self.decay_steps <= 0:
            raise ValueError(f"decay_steps must be positive (or unset: max_steps), got {self.decay_steps}")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise ValueError(f"min_learning_rate={self.min_learning_rate} must lie in [0, learning_rate={self.learning_rate}]")
