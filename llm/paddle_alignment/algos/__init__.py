"""Pure tensor functions of RL alignment, registered by name (see registry.py).

Importing this package registers every algorithm; the trainer looks them up by config value.
"""

from paddle_alignment.algos.registry import (  # noqa: F401
    ADVANTAGE_ESTIMATORS,
    DISTILL_LOSSES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LR_SCHEDULES,
    PAIRWISE_LOSSES,
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
    ROLLOUT_CORRECTIONS,
    UNPAIRED_PREFERENCE_LOSSES,
)
from paddle_alignment.algos import advantages, distillation, kl, losses, metrics, pairwise, preference, reward_shaping, rollout_correction, schedules, token_stats  # noqa: E402,F401
