"""Parameters of the critic (ppo): its optimizer, schedule, value clipping and recompute."""

from dataclasses import dataclass, field
from typing import Optional

from paddle_alignment.algos import LR_SCHEDULES
from paddle_alignment.config.checks import check_choices, check_non_negative


@dataclass
class CriticArguments:
    """Parameters that control the critic (ppo): its optimizer, schedule, value clipping and recompute."""

    critic_learning_rate: float = field(default=5e-6, metadata={"help": "Critic peak learning rate (ppo)."})
    critic_min_learning_rate: float = field(default=0.0, metadata={"help": "The critic's schedule decays to this."})
    critic_weight_decay: float = field(default=0.0, metadata={"help": "Critic AdamW weight decay."})
    critic_lr_scheduler_type: str = field(default="constant", metadata={"help": "Critic schedule: linear, cosine or constant."})
    critic_warmup_ratio: float = field(default=0.0, metadata={"help": "Share of steps of critic warm-up."})
    critic_decay_steps: Optional[int] = field(default=None, metadata={"help": "The critic's decay_steps (default max_steps)."})
    clip_range_value: float = field(default=5.0, metadata={"help": "Critic values move at most this far from their rollout values (ppo)."})
    critic_recompute: bool = field(default=False, metadata={"help": "Recompute critic activations in backward to save memory."})
    critic_recompute_granularity: str = field(
        default="full", metadata={"help": "What the critic recomputes: full, full_attn or core_attn (as recompute_granularity)."}
    )

    def validate_critic(self):
        check_choices(self, {"critic_lr_scheduler_type": LR_SCHEDULES})
        if self.critic_decay_steps is not None and self.critic_decay_steps <= 0:
            raise ValueError(f"critic_decay_steps must be positive (or unset: max_steps), got {self.critic_decay_steps}")
        check_non_negative(self, ["clip_range_value", "critic_weight_decay", "critic_learning_rate"])
        if not 0 <= self.critic_min_learning_rate <= self.critic_learning_rate:
            raise ValueError(
                f"critic_min_learning_rate={self.critic_min_learning_rate} must lie in [0, critic_learning_rate={self.critic_learning_rate}]"
            )
        if not 0 <= self.critic_warmup_ratio < 1:
            raise ValueError(f"critic_warmup_ratio must lie in [0, 1), got {self.critic_warmup_ratio}")
