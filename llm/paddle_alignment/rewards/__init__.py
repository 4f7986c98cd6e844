"""Rule rewards: `score(src, tgt, response) -> float`, registered by task name.

Each task also declares `max_score`, the score of a fully correct answer; a response counts as
accurate when it reaches it. Rule rewards parse model output; they never execute it.

`RewardTask.score_batch` is how the reward server and the in-process scorer call a rule: an item the
rule cannot score stops the batch with a `RewardInputError` naming the task, the item and its values.
A rule raises `TargetError` when the item's tgt is not in the form it reads (the caller's data is at
fault, not the response), which the error records as `unreadable_target`.
"""

import math
from dataclasses import dataclass
from typing import Callable, Dict

SHOWN_CHARS = 200
API_KEY_ENV = "REWARD_SERVER_API_KEY"  # the reward server's shared secret, read by the server and the trainer's client


class TargetError(ValueError):
    """A rule reward cannot read the reference answer (tgt) it was given."""


class RewardInputError(ValueError):
    """A rule reward could not score one item; the message names the task, the item and its values."""

    def __init__(self, message, unreadable_target=False):
        super().__init__(message)
        self.unreadable_target = unreadable_target


def shown(text, as_text=repr):
    """`as_text(text)`, cut to SHOWN_CHARS so one bad megabyte response does not flood the log."""
    if len(text) <= SHOWN_CHARS:
        return as_text(text)
    return f"{as_text(text[:SHOWN_CHARS])}... ({len(text)} chars)"


@dataclass(frozen=True)
class RewardTask:
    name: str
    score: Callable[[str, str, str], float]
    max_score: float

    def is_correct(self, score):
        return score >= self.max_score

    def score_batch(self, src, tgt, response):
        """One finite float per item, in order."""
        return [self.score_item(index, *item) for index, item in enumerate(zip(src, tgt, response))]

    def score_item(self, index, src, tgt, response):
        try:
            score = float(self.score(src, tgt, response))
        except Exception as error:
            # The cause is cut too: rules often quote the value they choke on.
            cause = shown(f"{type(error).__name__}: {error}", as_text=str)
            item = describe_item(index, src, tgt, response)
            raise RewardInputError(
                f"reward {self.name!r} cannot score {item}: {cause}", unreadable_target=isinstance(error, TargetError)
            ) from error
        if not math.isfinite(score):
            # A NaN or inf reward would poison every advantage of the batch.
            item = describe_item(index, src, tgt, response)
            raise RewardInputError(f"reward {self.name!r} gave the non-finite score {score} to {item}")
        return score


def describe_item(index, src, tgt, response):
    return f"item {index} (src={shown(src)}, tgt={shown(tgt)}, response={shown(response)})"


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
from paddle_alignment.rewards import arith, kk, math_reward  # noqa: E402,F401
