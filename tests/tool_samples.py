"""Tools for the tests of agents/tools.py: importable by name (tests/ is on the path of the tests and, through
PYTHONPATH, of their tool workers)."""

import time
from typing import Optional


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
