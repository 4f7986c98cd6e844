"""Rewards of the knights-and-knaves task (PaddleNLP's ppo-kk data).

The prompt opens the think block, so a response looks like
`reasoning</think>\n<answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>`.
Score = format part (+1 / -1) + answer part (+2 right, -1.5 wrong, -2 unparsable or bad format).

Two rule sets share that scale:
- `kk` follows PaddleNLP's kk reward server: the format holds when each of <think> (the prompt's
  counts), </think>, <answer>, </answer> appears once and in that order, text after </answer> included;
  the answer parses when its "knight"/"knave" words (substring counts, any case) number exactly the
  people of the puzzle and each person's first "NAME is a knight/knave" (any case) gives their role.
  It departs from that server in two places only:
  1. PaddleNLP's server puts <think> before every response, as if every prompt opened the think block;
     here the prompt's own ending decides (PaddleNLP's kk prompts end with <think>, so its data scores
     the same). A response opening <think> after a prompt that does not is well-formed here, and has
     two <think> (format -1) there.
  2. PaddleNLP's server reads any tgt line's first word as a name and first "knight"/"knave" as the
     role, and skips lines it cannot read with a printed warning; here every line must read
     "NAME is a knight/knave", numbered ("(1)", "1.", "1)") or not, with or without a full stop, and any
     other tgt is refused (when the data loads, or as a row error), since a skipped person is silently not
     graded.
  On the labelled cases of tests/data/reward_cases/kk.jsonl the two agree everywhere else
  (benchmarks/bench_rewards.py prints the count).
- `kk_strict` also refuses text after </answer> other than whitespace and end tokens, needs a prompt
  without <think> to be answered by a response opening it, reads names as whole words (any case), accepts
  "is an", and needs every claim about a person to agree, however many role words the answer holds.
  A claim hedged in its own clause ("Ethan is a knave or a knight", "Ethan is a knave, unless he is a
  knight", "Ethan is a knave if Zoey lies") decides nothing: the person is undecided, and the answer
  unparsable, as kk and PaddleNLP's server score such answers. It is right on every labelled case, `kk`
  on 85% (the misses are PaddleNLP's rules: "X is a knight, not a knave" unparsable, text after
  </answer> accepted, a hedge after a decided claim accepted).
Every check is a substring count or one linear-time regex scan, so adversarial output stays cheap.
"""

import re
from collections import defaultdict

from paddle_alignment.rewards import TargetError, register_reward
from paddle_alignment.rewards.think_answer import extract_answer, extract_answer_strictly

ROLE_WORDS = ("knight", "knave")

FORMAT_OK, FORMAT_BAD = 1.0, -1.0
ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSABLE = 2.0, -1.5, -2.0
MAX_SCORE = FORMAT_OK + ANSWER_RIGHT
MIN_SCORE = FORMAT_BAD + ANSWER_UNPARSABLE

_SOLUTION_LINE = re.compile(
    r"(?:\(\d+\)|\d+[.)])?\s*(?P<name>\w+)\s+is\s+an?\s+(?P<role>knight|knave)\.?", re.IGNORECASE
)
# One scan finds every claim, whatever the number of people: a pattern per person made a 1999-person
# answer of 850 KB cost 1999 scans (30 s).
_CLAIM = re.compile(r"(?<!\w)(?P<name>\w+)\s+is\s+a\s+(?P<role>knight|knave)\b", re.IGNORECASE)
_STRICT_CLAIM = re.compile(r"(?<!\w)(?P<name>\w+)\s+is\s+an?\s+(?P<role>knight|knave)\b", re.IGNORECASE)
# A clause ends at a line end, a full stop or a semicolon; one that holds a hedge leaves its claims undecided.
_CLAUSE = re.compile(r"[^\n.;]+")
_HEDGE = re.compile(
    r"\b(?:or|unless|if|whether|either|maybe|perhaps|possibly|probably|might|could|unsure|uncertain|unknown|undetermined)\b",
    re.IGNORECASE,
)


def parse_solution(tgt):
    """`(1) Zoey is a knight\\n(2) Oliver is a knave` -> {"Zoey": "knight", "Oliver": "knave"}."""
    solution = {}
    for line in filter(None, (line.strip() for line in tgt.splitlines())):
        match = _SOLUTION_LINE.fullmatch(line)
        if match is None:
            raise TargetError(f"kk tgt line {line!r} is not of the form '(1) NAME is a knight/knave' (numbering optional)")
        solution[match["name"]] = match["role"].lower()
    if not solution:
        raise TargetError(f"kk tgt {tgt!r} names nobody")
    return solution


def judge_answer(answer, solution):
    """PaddleNLP's reading: as many role words as people, and each person's first claim (any case)."""
    lowered = answer.lower()
    if sum(lowered.count(word) for word in ROLE_WORDS) != len(solution):
        return ANSWER_UNPARSABLE
    first_roles = {}
    for match in _CLAIM.finditer(answer):
        first_roles.setdefault(match["name"].lower(), match["role"].lower())
    predicted = {name: first_roles.get(name.lower()) for name in solution}
    if None in predicted.values():
        return ANSWER_UNPARSABLE
    return ANSWER_RIGHT if predicted == solution else ANSWER_WRONG


def judge_answer_strictly(answer, solution):
    """Every claim about each person (their name as a whole word, in any case) agrees, none is hedged, and each
    gives the solution's role."""
    roles, undecided = defaultdict(set), set()
    for clause in _CLAUSE.finditer(answer):
        hedged = _HEDGE.search(clause[0]) is not None
        for match in _STRICT_CLAIM.finditer(clause[0]):
            name = match["name"].lower()
            roles[name].add(match["role"].lower())
            if hedged:
                undecided.add(name)
    solution = {name.lower(): role for name, role in solution.items()}
    if any(len(roles[name]) != 1 or name in undecided for name in solution):
        return ANSWER_UNPARSABLE
    right = all(roles[name] == {role} for name, role in solution.items())
    return ANSWER_RIGHT if right else ANSWER_WRONG


def kk_score(src, tgt, response, extract, judge):
    solution = parse_solution(tgt)
    answer = extract(src, response)
    if answer is None:
        return MIN_SCORE
    return FORMAT_OK + judge(answer, solution)


@register_reward("kk", max_score=MAX_SCORE, min_score=MIN_SCORE, read_target=parse_solution)
def kk_reward(src, tgt, response):
    return kk_score(src, tgt, response, extract_answer, judge_answer)


@register_reward("kk_strict", max_score=MAX_SCORE, min_score=MIN_SCORE, read_target=parse_solution)
def kk_strict_reward(src, tgt, response):
    return kk_score(src, tgt, response, extract_answer_strictly, judge_answer_strictly)
