"""Tools and environments for the tests of agents/tools.py and agents/environments.py: importable by name (tests/
is on the path of the tests and, through PYTHONPATH, of their workers)."""

import re
import time
from typing import Optional

from paddle_alignment.agents.environments import Environment


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: the first addend.
        b: the second addend.
    """
    return a + b


def lookup(key: str, keys: list[str], scale: Optional[float] = None, strict: bool = False, extra: dict = None) -> str:
    """Look a key up."""
    return f"{key}:{len(keys)}:{scale}:{strict}:{extra}"


def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def hang(seconds: float) -> str:
    """Sleep for `seconds`."""
    time.sleep(seconds)
    return "woke"


class Countdown(Environment):
    """Answers `turns left: k` to each turn and rewards turn t with 10**t; done after the row's label turns."""

    def reset(self, row):
        self.left, self.turn = int(row["label"]), 0

    def step(self, action):
        reward, self.turn, self.left = 10.0**self.turn, self.turn + 1, self.left - 1
        return f"turns left: {self.left}", reward, self.left == 0


class GuessTheNumber(Environment):
    """Guess the row's number: a wrong guess is answered higher or lower; the right one earns 1 and ends."""

    def reset(self, row):
        self.secret = int(row["label"])

    def step(self, action):
        numbers = re.findall(r"-?\d+", action)
        if numbers and int(numbers[-1]) == self.secret:
            return "correct", 1.0, True
        return "higher" if not numbers or int(numbers[-1]) < self.secret else "lower", 0.0, False


class FailsAtSecondStep(Environment):
    """Raises on its second step; hangs on its third when the row's label says "hang"; answers a number instead
    of a text when it says "number"."""

    def reset(self, row):
        self.label, self.steps = row["label"], 0

    def step(self, action):
        self.steps += 1
        if self.label == "number":
            return 7, 0.0, False
        if self.steps == 2 and self.label != "hang":
            raise ZeroDivisionError("the environment's own bug")
        if self.steps == 3:
            time.sleep(60)
        return "go on", 1.0, False


class NoStep(Environment):
    def reset(self, row):
        pass
