"""Rewards of math problems (GSM8K, MATH): the reference (tgt) is GSM8K's answer text (its number follows
the last `####`), a MATH solution (its last `\\boxed{}`), or the bare answer: `72`, `1,234`, `\\frac{3}{4}`,
`2\\sqrt{2}`, `(3, \\frac{\\pi}{2})`, `[2, 5)`, `\\{1, 2\\}`.

- `math`: 1 when the response's final answer equals the reference (`math_grader.grade`), else 0.
- `gsm8k_strict`: the GSM8K strict rule recipes reproduce (verl's `gsm8k` reward): 1 when the last
  `#### NUMBER` of the response's last 300 characters, commas and `$` removed, is the reference's number
  as a string, else 0.
- `math_think_answer`: the widely copied Qwen2.5 GSM8K GRPO recipe: an answer part of +1 right / -1 wrong
  (graded as `math`, on the `<answer>` block when there is one) plus a format part of +1.25 when the
  response is exactly `<think>...</think><answer>...</answer>`, -1 otherwise.
"""

import functools
import re

from paddle_alignment.rewards import TargetError, register_reward, shown
from paddle_alignment.rewards.math_grader import GSM8K_MARK, TEXT_ANSWER_WORDS, grade, read_reference
from paddle_alignment.rewards.think_answer import has_exact_format

STRICT_TAIL_CHARS = 300
_STRICT_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
_STRICT_REFERENCE = re.compile(r"-?[0-9.,]+")

ANSWER_RIGHT, ANSWER_WRONG = 1.0, -1.0
FORMAT_EXACT, FORMAT_BAD = 1.25, -1.0


@functools.lru_cache(maxsize=65536)
def math_reference(tgt):
    """The Reading of a math reference; TargetError when it cannot be read. Cached: a prompt's reference
    is read once per response of its group."""
    try:
        reading = read_reference(tgt)
    except ValueError as error:  # Python's limit on the digits of an integer string (4,300) among them
        raise TargetError(f"math tgt {shown(tgt)} cannot be read: {error}") from None
    if reading is None:
        raise TargetError(f"math tgt {shown(tgt)} has no answer that reads as a number, a LaTeX expression or a text of at most "
                          f"{TEXT_ANSWER_WORDS} words")
    return reading


@register_reward("math", max_score=1.0, min_score=0.0, read_target=math_reference)
def math_reward(src, tgt, response):
    return 1.0 if grade(math_reference(tgt), response, src) else 0.0


def strict_reference(tgt):
    mark = tgt.rfind(GSM8K_MARK)
    text = (tgt[mark + len(GSM8K_MARK) :] if mark >= 0 else tgt).strip()
    if not _STRICT_REFERENCE.fullmatch(text):
        raise TargetError(f"gsm8k_strict tgt {shown(tgt)} is neither a number nor an answer ending in '#### NUMBER'")
    return text.replace(",", "")


@register_reward("gsm8k_strict", max_score=1.0, min_score=0.0, read_target=strict_reference)
def gsm8k_strict_reward(src, tgt, response):
    answers = _STRICT_ANSWER.findall(response[-STRICT_TAIL_CHARS:])
    if not answers:
        return 0.0
    return 1.0 if answers[-1].replace(",", "") == strict_reference(tgt) else 0.0


@register_reward(
    "math_think_answer",
    max_score=ANSWER_RIGHT + FORMAT_EXACT,
    min_score=ANSWER_WRONG + FORMAT_BAD,
    read_target=math_reference,
    parts={"answer": (ANSWER_WRONG, ANSWER_RIGHT), "format": (FORMAT_BAD, FORMAT_EXACT)},
)
def math_think_answer_reward(src, tgt, response):
    return {
        "answer": ANSWER_RIGHT if grade(math_reference(tgt), response, src) else ANSWER_WRONG,
        "format": FORMAT_EXACT if has_exact_format(src, response) else FORMAT_BAD,
    }
