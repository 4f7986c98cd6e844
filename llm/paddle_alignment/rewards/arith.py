"""Reward of the tiny demo task: sums of single digits written as `a+b+c=`."""

import re

from paddle_alignment.rewards import TargetError, register_reward

_INTEGER = re.compile(r"-?\d{1,6}")


@register_reward("arith", max_score=1.0)
def arith_reward(src, tgt, response):
    """1.0 when the response is exactly the expected integer (surrounding spaces allowed), else 0.0."""
    if not _INTEGER.fullmatch(tgt.strip()):
        raise TargetError(f"arith tgt {tgt!r} is not an integer")
    answer = response.strip()
    if not _INTEGER.fullmatch(answer):
        return 0.0
    return 1.0 if int(answer) == int(tgt) else 0.0
