"""Grading of math answers: find a response's final answer as a person grading would, read it, compare.

Finding the answer (`final_answer`), in the response's last `TAIL_CHARS` characters:
1. inside the last `<answer>...</answer>` when there is one, else in the whole tail;
2. the marker that comes last wins: `#### N` (GSM8K), `\\boxed{...}` / `\\fbox{...}`, or a phrase such as
   "the answer is", "Final answer:", "Answer =". A corrected answer (`\\boxed{10} ... \\boxed{12}`) is 12;
3. without a marker, the `<answer>` text itself (its last number when it is a sentence: "She needs 15 more."),
   else the last number of the tail.
An answer hedged between different values ("72 or 73", `\\boxed{72} or \\boxed{73}`) is wrong unless the
reference itself lists alternatives; an "or" that restates the value ("one hundred, or \\boxed{100}") is
no hedge.

Reading (`clean`): units and `\\text{}` dropped, thousands separators (`1,000`, `1{,}000`, `1\\,000`) and
Unicode minus (full-width too), times and pi read, `$`/`\\(`, `\\left`/`\\right`, spacing commands and `x =` dropped, a percent
sign kept as a flag (either side's matches the other's number or its hundredth); a choice letter ("(C)", "C")
compared by its letter. Plain numbers (integers, decimals, `a/b`, `\\frac{a}{b}`) are compared exactly here;
everything else (roots, pi, powers, intervals, sets, tuples, expressions) is parsed and compared
symbolically by math-verify's LaTeX-to-SymPy parser in worker processes with a deadline
(`rewards/symbolic.py`).
"""

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from paddle_alignment.rewards.symbolic import symbolic_math

# Final answers come at the end: grading the tail bounds the cost of a response of any length.
TAIL_CHARS = 4000
# A hedge names its alternatives close together: "72 or \\boxed{73}".
HEDGE_WINDOW = 40
GSM8K_MARK = "####"

_ANSWER_TAG = re.compile(r"<answer>(?P<inner>.*?)(?:</answer>|$)", re.DOTALL)
_GSM8K = re.compile(r"####[ \t]*(?P<text>[^\n]*)")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*(?=\{)|\\boxed\s+(?=[^\s{])")
_PHRASE = re.compile(
    r"\b(?:final\s+answer|the\s+answer|answer)\b\s*(?:is\b|should\s+be\b|would\s+be\b|[:=])\s*:?\s*", re.IGNORECASE
)
# A phrase's answer ends where its sentence does.
_SENTENCE_END = re.compile(r"\n|[.;!?](?:\s|$)|,\s+(?:so|which|since|because|and)\b|\s+(?:because|since|as|but|and\s+not)\s")
# "The answer is the total of 3 and 4, so 7": prose after the phrase names no answer.
_PROSE = re.compile(r"(?:[A-Za-z]{2,}\W+){3}")
# A minus sign counts only where it does not join two words ("2-3 apples" holds 2 and 3, not -3).
_NUMBER = re.compile(r"(?:(?<![\w)])-)?\\?\$?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|\.\d+)|\\frac\{-?\d+\}\{\d+\}")
_HEDGE_BEFORE = re.compile(r"(?:\bor|\band/or|/)\s*[$({\\]*\s*$", re.IGNORECASE)
_ALTERNATIVES = re.compile(r"\bor\b|\\text\{\s*or\s*\}|\\lor\b", re.IGNORECASE)

# Signs in other code points: the minus sign, the full-width forms.
_SIGNS = str.maketrans({"\u2212": "-", "\uff0d": "-", "\uff0b": "+"})
_UNICODE = _SIGNS | str.maketrans({"\u2013": "-", "\uff0e": ".", "\uff05": "%", "\u00d7": r"\times ", "\u00f7": "/", "\u03c0": r"\pi ", "\u221a": r"\sqrt", "\u00a0": " ", "\u00b0": ""})
_DROPPED = re.compile(r"\\left\b|\\right\b|(?<!\\)\\[,;:! ]|\\displaystyle|\\mathrm\b(?=\{\s*[\d.]+\s*\})|\^\s*\{?\\circ\}?|\*\*")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{(?P<inner>[^{}]*)\}(?P<power>\^\{?\d\}?)?")
_TEXT_OR = re.compile(r"\\text\{\s*(?:or|and)\s*\}|\s+or\s+")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
_TRAILING_WORDS = re.compile(r"^(?P<value>-?[\d.,/]+)\s+[a-zA-Z][a-zA-Z .]*$")
_VARIABLE = re.compile(r"^[a-zA-Z]\w*\s*=\s*(?P<value>[^=]+)$")
_PERCENT = re.compile(r"\s*\\?%\s*$")
_CHOICE = re.compile(r"^\(?(?P<letter>[A-E])\)?$")  # a multiple-choice answer: (C), C), C
# Words outside \text{} are not math: "seventy-two" would parse as a product of 11 symbols.
_COMMANDS = re.compile(r"\\(?:begin|end)\{[^}]*\}|\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")
MATH_WORDS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "arcsin", "arccos", "arctan", "max", "min", "gcd", "lcm", "mod", "infty", "inf", "det", "deg"}
_PLAIN = re.compile(r"^(?P<sign>-?)(?:(?P<decimal>\d*\.?\d+(?:[eE][+-]?\d+)?)|(?P<num>\d+)/(?P<den>\d+)|\\frac\{(?P<fnum>-?\d+)\}\{(?P<fden>\d+)\})$")


@dataclass(frozen=True)
class Answer:
    text: str  # as written (LaTeX or plain)
    alternative: Optional[str] = None  # a number offered just before it: the 72 of "72 or \\boxed{73}"


@dataclass(frozen=True)
class Reading:
    """An answer read: `value` when it is a plain number (else None, to be compared symbolically)."""

    text: str
    value: Optional[Fraction]
    percent: bool
    words: bool  # an answer in words (MATH's `\\text{Evelyn}`, `(C)`), compared as text

    @property
    def is_math(self):
        """Whether the text can be a number or a formula (not prose)."""
        bare = _COMMANDS.sub(" ", self.text)
        return all(word.lower() in MATH_WORDS for word in _WORD.findall(bare))

    @property
    def is_empty(self):
        return not self.text


def brace_pairs(text):
    """{position of "{": position of its "}"} of the braces of `text` that close, in one pass."""
    pairs, opened = {}, []
    for index, char in enumerate(text):
        if char == "{":
            opened.append(index)
        elif char == "}" and opened:
            pairs[opened.pop()] = index
    return pairs


def markers(text):
    """(start, answer text) of every explicit final-answer marker of `text` that holds an answer."""
    return [(start, answer) for start, answer in all_markers(text) if answer.strip()]


def all_markers(text):
    found = [(m.start(), m["text"]) for m in _GSM8K.finditer(text)]
    pairs = brace_pairs(text) if "\\" in text else {}
    for match in _BOX_OPEN.finditer(text):
        brace = match.end()
        if text[brace] != "{":
            found.append((match.start(), text[brace:].split(maxsplit=1)[0].rstrip(".$")))
        elif brace in pairs:
            found.append((match.start(), text[brace + 1 : pairs[brace]]))
    for match in _PHRASE.finditer(text):
        end = _SENTENCE_END.search(text, match.end())
        answer = text[match.end() : end.start() if end else len(text)]
        if not _PROSE.match(_COMMANDS.sub("", answer)):
            found.append((match.start(), answer))
    return found


def final_answer(response):
    """The final answer of `response` (an Answer), or None when it gives none."""
    text = response[-TAIL_CHARS:].translate(_SIGNS)  # so that a number's sign is found with it
    tagged = None
    for tagged in _ANSWER_TAG.finditer(text):
        pass
    region = tagged["inner"] if tagged else text
    found = markers(region)
    if found:
        start, answer = max(found, key=lambda item: item[0])
    elif tagged and region.strip() and not is_sentence(region):
        start, answer = 0, region
    else:  # no answer block, or one that states its answer in a sentence: its last number
        numbers = list(_NUMBER.finditer(region))
        if not numbers:
            return None
        start, answer = numbers[-1].start(), numbers[-1][0]
    before = region[max(0, start - HEDGE_WINDOW) : start]
    hedge = _HEDGE_BEFORE.search(before)
    alternatives = list(_NUMBER.finditer(before[: hedge.start()])) if hedge else []
    return Answer(answer.strip(), alternatives[-1][0] if alternatives else None)


def is_sentence(text):
    """Whether `text` states an answer in words ("She needs 15 more stickers."): two words or more outside LaTeX
    commands that are not math's own (sin, max, ...)."""
    return sum(word.lower() not in MATH_WORDS for word in _WORD.findall(_COMMANDS.sub(" ", text))) >= 2


def strip_text_commands(text):
    """(text, is words): `\\text{...}` of a unit (no digits) is dropped with its power, of a number kept;
    an answer that is only text (`\\text{Evelyn}`, `\\text{(C)}`) keeps its words."""

    def keep_numbers(match):
        inner = match["inner"]
        return inner if re.search(r"\d", inner) else ""

    stripped = _TEXT.sub(keep_numbers, text)
    if stripped.strip(" .,;:!$()"):
        return stripped, False
    return _TEXT.sub(lambda match: match["inner"], text), True


def strip_math_delimiters(text):
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
        if len(text) > len(left) + len(right) - 1 and text.startswith(left) and text.endswith(right):
            text = text[len(left) : -len(right)]
    return text.replace("$", "")  # what is left is a currency sign


def clean(text):
    """The answer `text` as a Reading."""
    text = _TEXT_OR.sub(", ", text.translate(_UNICODE)).replace(r"\$", "").replace("{,}", "").replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    text, words = strip_text_commands(_DROPPED.sub("", text))
    text = strip_math_delimiters(text)
    text = text.strip().rstrip(".,;:!").lstrip(",;:!").strip()
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text)
    text = _THOUSANDS.sub(lambda match: match[0].replace(",", ""), text)
    for pattern in (_VARIABLE, _TRAILING_WORDS):
        match = pattern.match(text)
        if match:
            text = match["value"].strip()
    text = re.sub(r"(?<=\d) (?=\d{3}\b)", "", text)  # "1 000"
    return Reading(text, plain_value(text), percent, words or bool(_CHOICE.match(text)))


def plain_value(text):
    match = _PLAIN.match(text.replace(" ", ""))
    if match is None:
        return None
    if match["decimal"]:
        value = Fraction(match["decimal"])
    elif match["num"]:
        if int(match["den"]) == 0:
            return None
        value = Fraction(int(match["num"]), int(match["den"]))
    else:
        if int(match["fden"]) == 0:
            return None
        value = Fraction(int(match["fnum"]), int(match["fden"]))
    return -value if match["sign"] else value


def reference_text(tgt):
    """The answer part of a reference: its last final-answer marker's (GSM8K's `####`, a MATH solution's
    `\\boxed{}`, "The answer is"), else the whole text."""
    found = markers(tgt)
    return max(found, key=lambda item: item[0])[1] if found else tgt


def read_reference(tgt):
    """The Reading of a reference answer, or None when it cannot be read."""
    reading = clean(reference_text(tgt))
    if not re.search(r"[0-9A-Za-z]", reading.text):
        return None
    if reading.value is None and not reading.words:
        if not reading.is_math or not symbolic_math().readable(reading.text):
            return None
    return reading


def same_value(reference, answer):
    """Whether two Readings hold the same value; None when the symbolic comparison hit its deadline."""
    if reference.words or answer.words:
        return comparable_words(reference.text) == comparable_words(answer.text)
    if reference.value is not None and answer.value is not None:
        if answer.value == reference.value:
            return True
        # "25%" answers a reference of 0.25 or of 25, and 0.25 a reference of 25%.
        return (answer.percent and answer.value / 100 == reference.value) or (
            reference.percent and reference.value / 100 == answer.value
        )
    return symbolic_math().equal(reference.text, answer.text)


def comparable_words(text):
    """An answer in words as a person compares it: case and spacing aside, a choice letter with or without its
    parentheses ("(C)", "C")."""
    choice = _CHOICE.match(text.strip())
    return choice["letter"].lower() if choice else " ".join(text.lower().split())


def grade(reference, response):
    """True when `response`'s final answer equals the Reading `reference`; False otherwise, and when the
    comparison hit its deadline (counted and warned by symbolic_math)."""
    found = final_answer(response)
    if found is None:
        return False
    # "72 or 73" names alternatives: right only where the reference lists several values.
    if _ALTERNATIVES.search(found.text) and not _ALTERNATIVES.search(reference.text) and "," not in reference.text:
        return False
    answer = clean(found.text)
    if answer.is_empty:
        return False
    # "73 or \\boxed{72}" hedges; "one hundred, or \\boxed{100}" and "0.5 or \\boxed{\\frac{1}{2}}" restate.
    if found.alternative is not None and not same_value(answer, clean(found.alternative)):
        return False
    return bool(same_value(reference, answer))
