"""Rule rewards: `score(src, tgt, response) -> float`, registered by task name.

Each task also declares `max_score`, the score of a fully correct answer; a response counts as
accurate when it reaches it. Rule rewards parse model output; they never execute it.
"""

from dataclasses import dataclass
from typing import Callable, Dict


@dataclass(frozen=True)
class RewardTask:
    name: str
    score: Callable[[str, str, str], float]
    max_score: float

    def is_correct(self, score):
        return score >= self.max_score


REWARD_TASKS: Dict[str, RewardTask] = {}


def register_reward(name, max_score):
    """Decorator registering `fn(src, tgt, response) -> float` as the rule reward of task `name`."""

    def wrap(fn):
        if name in REWARD_TASKS:
            raise ValueError(f"reward task {name!r} is registered twice")
        REWARD_TASKS[name] = RewardTask(name, fn, float(max_score))
        return fn

    return wrap


def get_reward_task(name):
    if name not in REWARD_TASKS:
        raise ValueError(f"unknown reward task {name!r}; registered tasks: {sorted(REWARD_TASKS)}")
    return REWARD_TASKS[name]


# Importing the task modules registers them.
from llm.alignment.ppo.rewards import arith, kk, math_reward  # noqa: E402,F401
