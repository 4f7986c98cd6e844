"""Reward of the tiny demo task: sums of single digits written as `a+b+c=`."""

import re

from paddle_alignment.rewards import TargetError, register_reward

_INTEGER = re.compile(r"-?\d{1,6}")


def read_integer(tgt):
    if not _INTEGER.fullmatch(tgt.strip()):
        raise TargetError(f"arith tgt {tgt!r} is not an integer")
    return int(tgt)


@register_reward("arith", max_score=1.0, min_score=0.0, read_target=read_integer)
def arith_reward(src, tgt, response):
    """1.0 when the response is exactly the expected integer (surrounding spaces allowed), else 0.0."""
    expected = read_integer(tgt)
    answer = response.strip()
    if not _INTEGER.fullmatch(answer):
        return 0.0
    return 1.0 if int(answer) == expected else 0.0
