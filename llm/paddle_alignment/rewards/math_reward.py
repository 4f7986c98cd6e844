"""Reward of GSM8K-style math word problems: 1.0 when the final number equals the reference.

The reference (tgt) is a bare number ("1,234") or GSM8K's own answer text, whose number follows its
last `####` ("... so 48+24 = 72 clips.\n#### 72").
"""

import re
from decimal import Decimal

from paddle_alignment.rewards import TargetError, register_reward

ANSWER_MARK = "####"

# A minus sign counts only when it does not join two words ("2-3 apples" holds 2 and 3, not -3).
_NUMBER = re.compile(r"(?:(?<![\w)])(?P<minus>-))?\$?(?P<digits>\d+(?:,\d{3})*(?:\.\d+)?)")
_LEADING_SPACE = re.compile(r"\s*")


def to_decimal(match):
    value = Decimal(match["digits"].replace(",", ""))
    return -value if match["minus"] else value


def parse_reference(tgt):
    mark = tgt.rfind(ANSWER_MARK)
    number = tgt[mark + len(ANSWER_MARK) :] if mark >= 0 else tgt
    match = _NUMBER.fullmatch(number.strip())
    if match is None:
        raise TargetError(f"math tgt {tgt!r} is neither a number nor an answer ending in '#### NUMBER'")
    return to_decimal(match)


def extract_prediction(response):
    """The number right after the last `####`, else the last number anywhere; None without a number."""
    mark = response.rfind(ANSWER_MARK)
    if mark >= 0:
        after_mark = _LEADING_SPACE.match(response, mark + len(ANSWER_MARK)).end()
        match = _NUMBER.match(response, after_mark)
        if match:
            return to_decimal(match)
    last = None
    for last in _NUMBER.finditer(response):
        pass
    return None if last is None else to_decimal(last)


@register_reward("math", max_score=1.0)
def math_reward(src, tgt, response):
    reference = parse_reference(tgt)
    prediction = extract_prediction(response)
    return 1.0 if prediction is not None and prediction == reference else 0.0
