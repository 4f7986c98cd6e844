"""Reward of the knights-and-knaves task (PaddleNLP's ppo-kk data).

The prompt opens the think block, so a response looks like
`reasoning</think>\n<answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>`.
Score = format part (+1 / -1) + answer part (+2 right, -1.5 wrong, -2 unparsable or bad format).
Every check is a substring count or a linear-time regex, so adversarial output stays cheap.
"""

import re

from llm.alignment.ppo.rewards import register_reward
from llm.tools.chat_format import END_OF_TEXT, IM_END

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

FORMAT_OK, FORMAT_BAD = 1.0, -1.0
ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSABLE = 2.0, -1.5, -2.0

# Alternatives start with distinct characters, so matching is linear.
_ONLY_END_MARKS = re.compile(r"(?:\s|" + re.escape(IM_END) + "|" + re.escape(END_OF_TEXT) + r")*")
_SOLUTION_LINE = re.compile(r"\(\d+\)\s*(?P<name>\w+)\s+is\s+an?\s+(?P<role>knight|knave)", re.IGNORECASE)


def parse_solution(tgt):
    """`(1) Zoey is a knight\\n(2) Oliver is a knave` -> {"Zoey": "knight", "Oliver": "knave"}."""
    solution = {}
    for line in filter(None, (line.strip() for line in tgt.splitlines())):
        match = _SOLUTION_LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"kk tgt line {line!r} is not of the form '(1) NAME is a knight/knave'")
        solution[match["name"]] = match["role"].lower()
    if not solution:
        raise ValueError(f"kk tgt {tgt!r} names nobody")
    return solution


def extract_answer(src, response):
    """The text inside <answer></answer> when the response is well-formed, else None."""
    body = response
    if not src.rstrip().endswith(THINK_OPEN):
        # Prompts that do not open the think block leave opening it to the model.
        body = response.lstrip()
        if not body.startswith(THINK_OPEN):
            return None
        body = body[len(THINK_OPEN) :]
    if body.count(THINK_OPEN) or any(body.count(tag) != 1 for tag in (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)):
        return None
    think_end, answer_start, answer_end = (body.find(tag) for tag in (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE))
    if not think_end < answer_start < answer_end:
        return None
    if not _ONLY_END_MARKS.fullmatch(body, answer_end + len(ANSWER_CLOSE)):
        return None
    return body[answer_start + len(ANSWER_OPEN) : answer_end]


def roles_claimed(answer, name):
    """Every role the answer gives to `name` ("knight"/"knave"); whole-word names, so Ann is not Anna."""
    claim = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)\s+(?i:is\s+an?\s+(knight|knave))\b")
    return {role.lower() for role in claim.findall(answer)}


def judge_answer(answer, solution):
    roles = {name: roles_claimed(answer, name) for name in solution}
    if any(len(claimed) != 1 for claimed in roles.values()):
        return ANSWER_UNPARSABLE
    right = all(roles[name] == {role} for name, role in solution.items())
    return ANSWER_RIGHT if right else ANSWER_WRONG


@register_reward("kk", max_score=FORMAT_OK + ANSWER_RIGHT)
def kk_reward(src, tgt, response):
    solution = parse_solution(tgt)
    answer = extract_answer(src, response)
    if answer is None:
        return FORMAT_BAD + ANSWER_UNPARSABLE
    return FORMAT_OK + judge_answer(answer, solution)
