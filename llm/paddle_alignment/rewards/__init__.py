"""Rule rewards: `score(src, tgt, response)`, registered by task name.

A rule returns a float, or a dict of named parts (the score is their sum: the GSM8K recipe's answer and
format rewards). Each task declares `max_score`, the score of a fully correct answer (a response counts as
accurate when it reaches it), `min_score`, what a row it cannot score gets, and `read_target`, which
raises `TargetError` when a reference answer (tgt) is not in a form the rule reads, so a data file can be
checked when it loads. Rule rewards parse model output; they never execute it.

`RewardTask.score_batch` is how the reward server and the in-process scorer call a rule: one bad row
never stops the batch. A row the rule cannot score (its tgt unreadable, the rule raising or giving a
non-finite score, or, with a budget, its grading outlasting the batch's budget) gets `min_score` and an
error naming the task, the row and its values; the others are scored as usual.
"""

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

from paddle_alignment.deadline_workers import BudgetSpent, run_concurrently

SHOWN_CHARS = 200
# Seconds the reward server grades one request's rows in, together (its --grading_budget): well below the
# trainer's default reward_server_timeout (60 s), which must exceed the budget by BUDGET_MARGIN_SECONDS to
# leave room for queueing and transfer.
DEFAULT_GRADING_BUDGET = 20.0
BUDGET_MARGIN_SECONDS = 10.0
API_KEY_ENV = "REWARD_SERVER_API_KEY"  # the reward server's shared secret, read by the server and the trainer's client


class TargetError(ValueError):
    """A rule reward cannot read the reference answer (tgt) it was given."""


class RewardInputError(ValueError):
    """A rule reward could not score one item; the message names the task, the item and its values."""


def shown(text, as_text=repr):
    """`as_text(text)`, cut to SHOWN_CHARS so one bad megabyte response does not flood the log."""
    if len(text) <= SHOWN_CHARS:
        return as_text(text)
    return f"{as_text(text[:SHOWN_CHARS])}... ({len(text)} chars)"


@dataclass
class ScoredBatch:
    """The scores of a batch, its rows' score parts by name (empty for a rule without parts), and the
    (row, message) of each row that could not be scored, which got the task's min_score."""

    scores: List[float]
    parts: Dict[str, List[float]] = field(default_factory=dict)
    errors: List[Tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class RewardTask:
    name: str
    score: Callable[[str, str, str], object]
    max_score: float
    min_score: float
    read_target: Callable[[str], object]
    parts: Dict[str, Tuple[float, float]]  # name -> (min, max) of each part of the score

    def is_correct(self, score):
        return score >= self.max_score

    def score_batch(self, src, tgt, response, problems=None, budget=None):
        """A ScoredBatch of the rows, in order; `problems`: {row: why} of rows known not to be scorable
        (the reward server's malformed rows), which are not given to the rule. Rows are graded concurrently
        (their symbolic comparisons share the workers), all within `budget` seconds when one is given: a row
        still being graded then gets min_score and an error saying so."""
        rows = list(zip(src, tgt, response))
        problems = dict(problems or {})
        graded = [index for index in range(len(rows)) if index not in problems]
        outcomes = run_concurrently([functools.partial(self.score_item, index, *rows[index]) for index in graded], budget)
        found = {}
        for index, (parts, error) in zip(graded, outcomes):
            if isinstance(error, BudgetSpent):
                problems[index] = (
                    f"reward {self.name!r} did not grade {describe_item(index, *rows[index])} within the batch's "
                    f"grading budget of {budget:g} s (slow answers of the batch took it)"
                )
            elif isinstance(error, RewardInputError):
                problems[index] = str(error)
            elif error is not None:
                raise error
            else:
                found[index] = parts
        batch = ScoredBatch([], {name: [] for name in self.parts})
        unscored = {name: low for name, (low, _) in self.parts.items()} or {"": self.min_score}
        for index in range(len(rows)):
            if index in problems:
                batch.errors.append((index, problems[index]))
            parts = found.get(index, unscored)
            batch.scores.append(sum(parts.values()))
            for name in self.parts:
                batch.parts[name].append(parts[name])
        return batch

    def score_item(self, index, src, tgt, response):
        """The row's parts by name ({"": score} for a rule without parts)."""
        try:
            result = self.score(src, tgt, response)
            parts = {name: float(value) for name, value in result.items()} if isinstance(result, dict) else {"": float(result)}
        except BudgetSpent:
            raise
        except Exception as error:
            # The cause is cut too: rules often quote the value they choke on.
            cause = shown(f"{type(error).__name__}: {error}", as_text=str)
            item = describe_item(index, src, tgt, response)
            raise RewardInputError(f"reward {self.name!r} cannot score {item}: {cause}") from error
        if not all(map(math.isfinite, parts.values())):
            # A NaN or inf reward would poison every advantage of the batch.
            item = describe_item(index, src, tgt, response)
            raise RewardInputError(f"reward {self.name!r} gave the non-finite score {parts} to {item}")
        return parts

    def check_target(self, tgt):
        """Raise TargetError when the rule cannot read the reference answer `tgt`."""
        if not isinstance(tgt, str):
            raise TargetError(f"reward {self.name!r} needs a string tgt, got {type(tgt).__name__} {tgt!r}")
        self.read_target(tgt)

    def target_refusal(self, tgt):
        """Why the rule cannot read the reference answer `tgt`, or None when it can: the check a dataset runs on
        its labels when it loads."""
        try:
            self.check_target(tgt)
        except TargetError as error:
            return str(error)
        return None


def describe_item(index, src, tgt, response):
    return f"item {index} (src={shown(src)}, tgt={shown(tgt)}, response={shown(response)})"


REWARD_TASKS: Dict[str, RewardTask] = {}


def register_reward(name, max_score, min_score, read_target, parts=None):
    """Decorator registering `fn(src, tgt, response)` as the rule reward of task `name`; `parts`: the
    (min, max) of each named part when fn returns a dict of parts."""

    def wrap(fn):
        if name in REWARD_TASKS:
            raise ValueError(f"reward task {name!r} is registered twice")
        REWARD_TASKS[name] = RewardTask(name, fn, float(max_score), float(min_score), read_target, dict(parts or {}))
        return fn

    return wrap


def get_reward_task(name):
    if name not in REWARD_TASKS:
        raise ValueError(f"unknown reward task {name!r}; registered tasks: {sorted(REWARD_TASKS)}")
    return REWARD_TASKS[name]


# Importing the task modules registers them.
from paddle_alignment.rewards import arith, kk, math_reward  # noqa: E402,F401
