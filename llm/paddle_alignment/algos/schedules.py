"""Learning-rate schedules with linear warm-up that decay to `min_learning_rate` instead of zero."""

import math

import paddle

from paddle_alignment.algos.registry import LR_SCHEDULES


def warmup_factor(step, warmup_steps):
    return (step + 1) / warmup_steps if step < warmup_steps else None


def decay_progress(step, warmup_steps, total_steps):
    return min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))


@LR_SCHEDULES.register("linear")
def linear_schedule(step, warmup_steps, total_steps, lr, min_lr):
    warm = warmup_factor(step, warmup_steps)
    if warm is not None:
        return lr * warm
    return lr - (lr - min_lr) * decay_progress(step, warmup_steps, total_steps)


@LR_SCHEDULES.register("cosine")
def cosine_schedule(step, warmup_steps, total_steps, lr, min_lr):
    warm = warmup_factor(step, warmup_steps)
    if warm is not None:
        return lr * warm
    progress = decay_progress(step, warmup_steps, total_steps)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@LR_SCHEDULES.register("constant")
def constant_schedule(step, warmup_steps, total_steps, lr, min_lr):
    warm = warmup_factor(step, warmup_steps)
    return lr * warm if warm is not None else lr


def build_lr_scheduler(name, learning_rate, min_learning_rate, warmup_steps, total_steps):
    """A paddle LambdaDecay following the registered schedule `name` (its state saves with the optimizer's)."""
    schedule = LR_SCHEDULES.get(name)

    def factor(step):
        return schedule(step, warmup_steps, total_steps, learning_rate, min_learning_rate) / learning_rate

    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor)
