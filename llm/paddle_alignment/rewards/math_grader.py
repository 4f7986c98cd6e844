"""Grading of math answers: find a response's final answer as a person grading would, read it, compare.

Finding the answer (`final_answer`), in the response's last `TAIL_CHARS` characters:
1. inside the last `<answer>...</answer>` when there is one, else in the whole tail;
2. the marker that comes last wins: `#### N` (GSM8K), `\\boxed{...}` / `\\fbox{...}`, or a phrase such as
   "the answer is", "Final answer:", "Answer =". A corrected answer (`\\boxed{10} ... \\boxed{12}`) is 12;
3. without a marker, the `<answer>` text itself (when it is a sentence, the math after its last "is"/"=", else
   its last number: "She needs 15 more."), else the last number of the tail; a response that only repeats
   the question, counts, or opens boxes it never closes answers nothing.
An answer hedged between different values is wrong unless the reference itself lists them (see `grade`).

Reading (`clean`): units and `\\text{}` dropped, thousands separators (`1,000`, `1{,}000`, `1\\,000`) and
Unicode minus (full-width too), times and pi read, number words, mixed numbers and repeating decimals read, `$`/`\\(`, `\\left`/`\\right`, spacing commands and `x =` dropped, a percent
sign kept as a flag (either side's matches the other's number or its hundredth); a choice letter ("(C)", "C")
compared by its letter. Plain numbers (integers, decimals, `a/b`, `\\frac{a}{b}`) are compared exactly here;
everything else (roots, pi, powers, intervals, sets, tuples, expressions) is parsed and compared
symbolically by math-verify's LaTeX-to-SymPy parser in worker processes with a deadline
(`rewards/symbolic.py`).
"""

import math
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
TEXT_ANSWER_WORDS = 3  # the most words of a reference compared as text
# A whole number of more digits than this is no number a reference holds (Python reads 4,300 digits at most).
HUGE_DIGITS = 10_000

_ANSWER_TAG = re.compile(r"<answer>(?P<inner>.*?)(?:</answer>|$)", re.DOTALL)
_GSM8K = re.compile(r"####[ \t]*(?P<text>[^\n]*)")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*(?=\{)|\\boxed\s+(?=[^\s{])")
_PHRASE = re.compile(
    r"\b(?:final\s+answer|the\s+answer|(?:correct|right)\s+(?:answer|option|choice)|answer)\b\s*"
    r"(?:is\b|should\s+be\b|would\s+be\b|[:=])\s*:?\s*",
    re.IGNORECASE,
)
# A phrase's answer ends where its sentence does.
_SENTENCE_END = re.compile(r"\n|[.;!?](?:\s|$)|,\s+(?:so|which|since|because|and)\b|\s+(?:because|since|as|but|and\s+not)\s")
# "The answer is the total of 3 and 4, so 7": prose after the phrase names no answer.
_PROSE = re.compile(r"(?:[A-Za-z]{2,}\W+){3}")
# A minus sign counts only where it does not join two words ("2-3 apples" holds 2 and 3, not -3); "1 1/2" is
# one mixed number.
_NUMBER = re.compile(
    r"(?:(?<![\w)])-)?\\?\$?(?:\d+ \d+/\d+(?![\d/])|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|\.\d+)(?: (?:thousand|million|billion|trillion)\b| ?\\?%)?"
    r"|\\[dt]?frac\{-?\d+\}\{\d+\}"
)
# "72 or x = \\boxed{73}": a number offered just before the final answer.
_HEDGE_BEFORE = re.compile(r"(?:\bor|\band/or|/)\s*(?:[a-zA-Z]\s*=\s*)?[$({\\]*\s*$", re.IGNORECASE)
# "40 km/h, which is about 11.1 m/s": a value given again in other units.
_RESTATED_BEFORE = re.compile(r"(?:,\s*|\s+)(?:which\s+is|i\.e\.,?|that\s+is)\s+(?:about\s+|approximately\s+|roughly\s+)?[$({\\]*\s*$", re.IGNORECASE)
_INLINE_MATH = re.compile(r"\$(?P<inner>[^$]+)\$")
_RELATION = re.compile(r"[<>]|\\(?:le|ge|leq|geq|neq|ne|lt|gt)\b")
# What may join two answers offered together: "\\boxed{72}, \\boxed{73}", "The answer is 12. The answer is 13."
_JOINED = re.compile(r"[\s.,;:$]*(?:(?:or|and|and/or)\b[\s,$]*)?(?:[a-zA-Z]\s*=\s*)?\$?\s*", re.IGNORECASE)
# "\\boxed{6} \\quad (\\text{or possibly } 7)": another value offered just after the final answer.
_HEDGE_AFTER = re.compile(
    r"[\s$.,;]*(?:\\q?quad)?\s*\(?\s*(?:\\text\{\s*)?(?:or|and/or)\b(?:\s+(?:possibly|maybe|perhaps|probably))?\s*\}?\s*"
    r"(?:[a-zA-Z]\s*=\s*)?[$({\\]*\s*(?P<value>-?\d[\d.,/]*)",
    re.IGNORECASE,
)
# "So f(x) = x^2 + 1.": in an answer sentence, what follows its last "is" or "=".
_STATED = re.compile(r"(?:\b(?:is|are|equals|be)\b|=)\s*", re.IGNORECASE)
_BOX_OPENING = re.compile(r"\\boxed\s*\{")
_POWER = re.compile(r"(?P<base>\d+)\s*\^\s*(?:\{(?P<exponent>.*)\}|(?P<digit>\d))", re.DOTALL)
_UNCLOSED_AT_START = re.compile(r"^\s*\\boxed\s*\{(?=[^{}]*$)")
_COUNTING_TEXT = re.compile(r"[\d\s,.;]*")
_ALTERNATIVES = re.compile(r"\bor\b(?!\s+so\b)|\\text\{\s*or\s*\}|\\lor\b", re.IGNORECASE)

# Signs in other code points: the minus sign, the full-width forms.
_SIGNS = str.maketrans({"\u2212": "-", "\uff0d": "-", "\uff0b": "+"})
_UNICODE = _SIGNS | str.maketrans({
    "\u2013": "-", "\uff0e": ".", "\uff05": "%", "\u00d7": r"\times ", "\u00f7": "/", "\u03c0": r"\pi ", "\u221a": r"\sqrt",
    "\u00a0": " ", "\u00b0": "", "\u00b2": "^2", "\u00b3": "^3", "\u20ac": "", "\u00a3": "", "\u00a5": "", "\u20b9": "",
})
_DROPPED = re.compile(r"\\(?:left|right)\.|\\left\b|\\right\b|(?<!\\)\\[,;:! ]|\\displaystyle|\\mathrm\b(?=\{\s*[\d.]+\s*\})|\^\s*\{?\\circ\}?|\*\*")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{(?P<inner>[^{}]*)\}(?P<power>\^\{?\d\}?)?")
_TEXT_OR = re.compile(r"\\text\{\s*(?:or|and)\s*\}|\s+or\s+")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
_TRAILING_WORDS = re.compile(
    r"^(?P<value>-?[\d.,/]+(?: \d+/\d+)?)(?:\s+[a-zA-Z][a-zA-Z .]*|\s*(?:mm|cm|m|km|in|ft|yd|mi|units?)\s*\^\s*\{?[23]\}?)$"
)
_SCALED = re.compile(r"^(?P<value>\d+(?:\.\d+)?)\s*(?P<scale>thousand|million|billion|trillion)(?:\s+[a-zA-Z]+)*$", re.IGNORECASE)
_TEXT_SCALE = re.compile(r"\\text\s*\{\s*(thousand|million|billion|trillion)\s*\}", re.IGNORECASE)
SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_UNIT_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
NUMBER_WORDS = {word: value for value, word in enumerate(_UNIT_WORDS.split())} | {
    word: 10 * value for value, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)
}
_NUMBER_WORD = "|".join(sorted(NUMBER_WORDS, key=len, reverse=True))
# "There are eleven primes.": a number in words, in an answer sentence without digits.
_SPELLED = re.compile(rf"\b(?:{_NUMBER_WORD})(?:[\s-]+(?:{_NUMBER_WORD}|hundred|thousand|million|billion|and))*\b", re.IGNORECASE)
_REPEATING = re.compile(r"^(?P<sign>-?)(?P<whole>\d*)\.(?P<fixed>\d*)\\overline\{(?P<repeat>\d+)\}$")
_MIXED = re.compile(r"^(?P<sign>-?)(?P<whole>\d+)(?: +(?P<num>\d+)/(?P<den>\d+)|\s*\\frac\{(?P<fnum>\d+)\}\{(?P<fden>\d+)\})$")
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
    alternative: Optional[str] = None  # a value offered beside it: the 72 of "72 or \\boxed{73}"
    restated: Optional[str] = None  # the same quantity in other units: the 90 of "90 minutes, or 1.5 hours"


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
    """(start, end, answer text) of every explicit final-answer marker of `text` that holds an answer."""
    return [found for found in all_markers(text) if found[2].strip()]


def all_markers(text):
    found = [(m.start(), m.end(), m["text"]) for m in _GSM8K.finditer(text)]
    pairs = brace_pairs(text) if "\\" in text else {}
    for match in _BOX_OPEN.finditer(text):
        brace = match.end()
        if text[brace] != "{":
            answer = text[brace:].split(maxsplit=1)[0]
            found.append((match.start(), brace + len(answer), answer.rstrip(".$")))
        elif brace in pairs:
            found.append((match.start(), pairs[brace] + 1, text[brace + 1 : pairs[brace]]))
    for match in _PHRASE.finditer(text):
        end = _SENTENCE_END.search(text, match.end())
        stop = end.start() if end else len(text)
        answer = _UNCLOSED_AT_START.sub("", text[match.end() : stop])  # "the answer is \\boxed{6" cut short
        if not _PROSE.match(_COMMANDS.sub("", answer)):
            found.append((match.start(), stop, answer))
    return found


def final_answer(response, prompt=""):
    """The final answer of `response` (an Answer), or None when it gives none; `prompt`: the question, which a
    response that only repeats it does not answer."""
    text = response[-TAIL_CHARS:].translate(_SIGNS)  # so that a number's sign is found with it
    tagged = None
    for tagged in _ANSWER_TAG.finditer(text):
        pass
    region = tagged["inner"] if tagged else text
    found = sorted(markers(region))
    if found:
        start, end, answer = found[-1]
        earlier = [marker for marker in found[:-1] if marker[1] <= start]
        if earlier and _JOINED.fullmatch(region[earlier[-1][1] : start]):  # two answers offered together
            return Answer(answer.strip(), earlier[-1][2].strip())
    elif tagged and region.strip() and not is_sentence(region):
        start, end, answer = 0, len(region), region
    elif tagged and (stated := stated_expression(region)):
        start, end, answer = stated
    else:  # no answer block, or one that states its answer in a sentence: its last number
        numbers = list(_NUMBER.finditer(region)) or list(_SPELLED.finditer(region))
        if not numbers or gives_no_answer(region, numbers, prompt):
            return None
        start, end, answer = numbers[-1].start(), numbers[-1].end(), numbers[-1][0]
        span = enclosing_math(region, start)
        if span:  # "The period is $2 \\pi$ radians.": the number's inline math (after its last "=") is the answer
            start, end, answer = span.start(), span.end(), span["inner"].rsplit("=", 1)[-1]
    return offered_with(region, start, end, answer.strip())


def offered_with(region, start, end, answer):
    """The Answer `answer` (at region[start:end]) with the value offered beside it, if any: "72 or \\boxed{73}",
    "\\boxed{6} (or possibly 7)". A value in other units ("90 minutes, or 1.5 hours") restates it."""
    after = _HEDGE_AFTER.match(region, end, end + HEDGE_WINDOW)
    if after:
        return Answer(answer, after["value"])
    before = region[max(0, start - HEDGE_WINDOW) : start]
    hedge = _HEDGE_BEFORE.search(before) or _RESTATED_BEFORE.search(before)
    alternatives = list(_NUMBER.finditer(before[: hedge.start()])) if hedge else []
    if not alternatives:
        return Answer(answer)
    alternative = alternatives[-1]
    unit_before = unit_word(before[alternative.end() : hedge.start()])
    unit_after = unit_word(region[end : end + HEDGE_WINDOW])
    if unit_before and unit_after and unit_before != unit_after:
        return Answer(answer, restated=alternative[0])
    if _RESTATED_BEFORE.fullmatch(before, hedge.start()):  # "which is" restates; in the same units, it is the answer
        return Answer(answer)
    return Answer(answer, alternative[0])


def enclosing_math(region, position):
    """The `$...$` span of `region` around `position`, or None (also for one that states an inequality)."""
    for span in _INLINE_MATH.finditer(region):
        if span.start() <= position < span.end():
            return None if _RELATION.search(span["inner"]) else span
    return None


def unit_word(text):
    """The unit that opens `text` ("minutes" of " minutes, or", "km/h"), or None."""
    match = re.match(r"\s*([A-Za-z]+(?:/[A-Za-z]+)?)\b", text)
    if match is None or match[1].lower() in ("or", "and", "which", "that", "i"):
        return None
    return match[1].lower()


def stated_expression(region):
    """(start, end, text) of the expression an answer sentence states after its last "is" or "=" ("So f(x) =
    x^2 + 1."), its trailing words dropped ("\\pi square units"); None when that is no math."""
    stated = None
    for stated in _STATED.finditer(region):
        pass
    if stated is None:
        return None
    end = _SENTENCE_END.search(region, stated.end())
    stop = end.start() if end else len(region)
    answer = re.sub(r"(?:\s+[A-Za-z]{2,})+\s*$", "", region[stated.end() : stop])
    if not answer.strip() or not clean(answer).is_math or not re.search(r"[\d\\]", answer):
        return None
    return stated.end(), stop, answer


def gives_no_answer(region, numbers, prompt):
    """Whether a response without a marker names no answer of its own: it opens two or more boxes, none holding
    an answer (degenerate output), only counts ("1, 2, 3, ..., 10"), or repeats the question."""
    if len(_BOX_OPENING.findall(region)) >= 2:  # no box holds an answer: the caller found no marker
        return True
    values = [match[0] for match in numbers]
    counting = len(values) >= 5 and all(value.isdigit() for value in values)
    if counting and _COUNTING_TEXT.fullmatch(region) and [int(v) for v in values] == list(range(int(values[0]), int(values[0]) + len(values))):
        return True
    words = " ".join(region.split())
    return len(words) >= 20 and words in " ".join(prompt.split())


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
    text = _TEXT_SCALE.sub(r" \1", text)  # "1 \\text{ million}" is a number, not 1 and a unit
    text, words = strip_text_commands(_DROPPED.sub("", text))
    text = strip_math_delimiters(text)
    text = text.strip().rstrip(".,;:!").lstrip(",;:!").strip()
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text)
    text = _THOUSANDS.sub(lambda match: match[0].replace(",", ""), text)
    scaled = _SCALED.match(text)
    if scaled:
        return Reading(text, Fraction(scaled["value"]) * SCALES[scaled["scale"].lower()], percent, False)
    for pattern in (_VARIABLE, _TRAILING_WORDS):
        match = pattern.match(text)
        if match:
            text = match["value"].strip()
    text = re.sub(r"(?<=\d) (?=\d{3}\b)", "", text)  # "1 000"
    value = plain_value(text)
    if value is None:
        value = spelled_number(text)
        words = words and value is None
    return Reading(text, value, percent, words or bool(_CHOICE.match(text)))


def plain_value(text):
    """The number `text` writes plainly (integer, decimal, fraction, mixed number, repeating decimal), or None."""
    mixed = _MIXED.match(text.strip())
    if mixed:
        numerator, denominator = int(mixed["num"] or mixed["fnum"]), int(mixed["den"] or mixed["fden"])
        if denominator == 0:
            return None
        value = int(mixed["whole"]) + Fraction(numerator, denominator)
        return -value if mixed["sign"] else value
    text = text.replace(" ", "")
    repeating = _REPEATING.match(text)
    if repeating:
        fixed, repeat = repeating["fixed"], repeating["repeat"]
        value = int(repeating["whole"] or 0) + Fraction(int(fixed or 0), 10 ** len(fixed))
        value += Fraction(int(repeat), 10 ** len(fixed) * (10 ** len(repeat) - 1))
        return -value if repeating["sign"] else value
    match = _PLAIN.match(text)
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


def spelled_number(text):
    """The whole number `text` spells in English ("twelve", "seventy-two", "two hundred and five", "three
    thousand"), words after it aside ("eighteen dollars"), or None."""
    total = current = read = 0
    words = re.split(r"[\s-]+", text.lower().strip())
    for word in words:
        if word in NUMBER_WORDS:
            current += NUMBER_WORDS[word]
        elif word == "hundred" and read:
            current *= 100
        elif word in SCALES and read:
            total, current = total + current * SCALES[word], 0
        elif not (word == "and" and read):
            break
        read += 1
    if not read or not all(word.isalpha() for word in words[read:]):
        return None
    return Fraction(total + current)


def reference_text(tgt):
    """The answer part of a reference: its last final-answer marker's (GSM8K's `####`, a MATH solution's
    `\\boxed{}`, "The answer is"), else the whole text."""
    found = markers(tgt)
    return max(found)[2] if found else tgt


def read_reference(tgt):
    """The Reading of a reference answer, or None when it cannot be read. A reference of a few words that are not
    math (`Monday`, `dark blue`) is compared as text; a longer one is prose without an answer (a solution that
    lost its `####`)."""
    reading = clean(reference_text(tgt))
    if not re.search(r"[0-9A-Za-z]", reading.text):
        return None
    if reading.value is None and not reading.words:
        if not reading.is_math:
            return Reading(reading.text, None, False, True) if len(reading.text.split()) <= TEXT_ANSWER_WORDS else None
        if not symbolic_math().readable(reading.text):
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
    if reference.value is not None and power_tower_digits(answer.text) > HUGE_DIGITS:
        return False  # SymPy would spend its whole deadline writing the integer out
    return symbolic_math().equal(reference.text, answer.text)


def power_tower_digits(text):
    """About how many digits the power tower of whole numbers `text` has (`9^{9^{9^{9}}}`: inf; `2^{10}`: 3.01),
    from the top down in logarithms; 0 when `text` is not such a tower, or one with a base below 2."""
    bases = []
    while (power := _POWER.fullmatch(text.strip())) is not None:
        bases.append(int(power["base"]))
        text = power["exponent"] if power["exponent"] is not None else power["digit"]
    if not bases or not text.strip().isdigit() or min(bases) < 2 or int(text) == 0:
        return 0.0
    digits = math.log10(int(text))  # log10 of the exponent so far
    for base in reversed(bases):
        digits = math.inf if digits > 300 else 10**digits * math.log10(base)
    return digits


def comparable_words(text):
    """An answer in words as a person compares it: case and spacing aside, a choice letter with or without its
    parentheses ("(C)", "C")."""
    choice = _CHOICE.match(text.strip())
    return choice["letter"].lower() if choice else " ".join(text.lower().split())


def lists_values(reading):
    """Whether a reference lists several values ("6, -4", "x = 2 or x = 3")."""
    return bool(_ALTERNATIVES.search(reading.text)) or "," in reading.text


def restates_itself(text):
    """Whether the values `text` joins by "or" are one value ("1/2 or 0.5"): a restatement, not a hedge."""
    parts = [clean(part) for part in _ALTERNATIVES.split(text) if part.strip()]
    return len(parts) > 1 and all(same_value(parts[0], part) for part in parts[1:])


def grade(reference, response, prompt=""):
    """True when `response`'s final answer equals the Reading `reference`; False otherwise, and when the
    comparison hit its deadline (counted and warned by symbolic_math). `prompt`: the question (a response that
    only repeats it answers nothing).

    The hedge rule, wherever two values are offered together ("72 or 73", "\\boxed{6} or x = \\boxed{-4}",
    "\\boxed{72}, \\boxed{73}", "The answer is 12. The answer is 13.", "\\boxed{6} (or possibly 7)"): wrong
    unless they are one value ("0.5 or \\boxed{\\frac{1}{2}}") or the reference lists several values, which
    they must then be together; the same quantity in other units ("90 minutes, or 1.5 hours") restates it,
    and either may be the reference's."""
    found = final_answer(response, prompt)
    if found is None:
        return False
    if _ALTERNATIVES.search(found.text) and not lists_values(reference) and not restates_itself(found.text):
        return False
    answer = clean(found.text)
    if answer.is_empty:
        return False
    if found.restated is not None:
        return bool(same_value(reference, answer) or same_value(reference, clean(found.restated)))
    if found.alternative is not None and not same_value(answer, clean(found.alternative)):
        # Offered together, two single values can be the reference's list: "\\boxed{6} or \\boxed{-4}" for "6, -4".
        if not lists_values(reference) or "," in found.text + found.alternative:
            return False
        answer = clean(f"{found.alternative}, {found.text}")
    return bool(same_value(reference, answer))
