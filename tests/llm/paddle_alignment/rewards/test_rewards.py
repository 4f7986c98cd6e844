import re
import time
from types import SimpleNamespace

import pytest

from paddle_alignment.chat_format import chat_prompt
from paddle_alignment.rewards import TargetError, get_reward_task
from paddle_alignment.rewards.scoring import RuleRewardScorer

KK_SRC = chat_prompt("Zoey says ...", system="Reason, then answer.", assistant_prefix="<think>")
KK_TGT = "(1) Zoey is a knight\n(2) Oliver is a knave"
PERFECT_ANSWER = "(1) Zoey is a knight\n(2) Oliver is a knave"


KK_TASKS = ["kk", "kk_strict"]


def kk(response, tgt=KK_TGT, src=KK_SRC, task="kk"):
    return get_reward_task(task).score(src, tgt, response)


def math_score(response, tgt):
    return get_reward_task("math").score("", tgt, response)


def wrapped(answer, reasoning="Zoey tells the truth, so Oliver lies."):
    return f"{reasoning}</think>\n<answer>{answer}</answer>"


# ---------------------------------------------------------------- kk (PaddleNLP's rules) and kk_strict


@pytest.mark.parametrize("task_name", KK_TASKS)
def test_kk_tasks_are_registered_with_max_score_3(task_name):
    task = get_reward_task(task_name)
    assert task.max_score == 3.0
    assert task.is_correct(kk(wrapped(PERFECT_ANSWER), task=task_name))
    assert not task.is_correct(kk(wrapped("(1) Zoey is a knave\n(2) Oliver is a knave"), task=task_name))


@pytest.mark.parametrize("task", KK_TASKS)
@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>", "\n<|im_end|>\n", "<|im_end|><|endoftext|>", "  \n"])
def test_kk_ignores_trailing_end_tokens_and_whitespace(task, end):
    assert kk(wrapped(PERFECT_ANSWER) + end, task=task) == 3.0


@pytest.mark.parametrize("task", KK_TASKS)
def test_kk_scores_right_wrong_and_case_insensitive_roles(task):
    assert kk(wrapped(PERFECT_ANSWER), task=task) == 3.0
    assert kk(wrapped("(1) Zoey is a knight\n(2) Oliver is a knight"), task=task) == -0.5
    assert kk(wrapped("(1) Zoey IS A Knight\n(2) Oliver is a KNAVE"), task=task) == 3.0


@pytest.mark.parametrize("task", KK_TASKS)
@pytest.mark.parametrize(
    "answer",
    [
        "(1) Zoey is a knight",  # Oliver missing
        "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Oliver is a knight",  # both roles
        "Zoey and Oliver are honest",  # no role statements at all
        "(1) Zoeya is a knight\n(2) Oliverx is a knave",  # names only as prefixes of other words
        "(1) Max is a knight\n(2) Liam is a knave",  # wrong names
        "",
    ],
)
def test_kk_unparsable_answer_scores_minus_1(task, answer):
    assert kk(wrapped(answer), task=task) == -1.0


# (response, score by kk as PaddleNLP's server gives it, score by kk_strict)
KK_RULE_DIFFERENCES = {
    # The parity cases: PaddleNLP ignores text after </answer>, and counts role words.
    "text_after_answer": (wrapped(PERFECT_ANSWER) + "\nI hope this helps!", 3.0, -3.0),
    "text_after_end_token": (wrapped(PERFECT_ANSWER) + "<|im_end|>more", 3.0, -3.0),
    "knight_not_a_knave": (wrapped("(1) Zoey is a knight, not a knave\n(2) Oliver is a knave"), -1.0, 3.0),
    "repeated_claims": (wrapped("Zoey is a knight. Oliver is a knave. So: Zoey is a knight, Oliver is a knave"), -1.0, 3.0),
    "extra_person": (wrapped("(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Max is a knight"), -1.0, 3.0),
    "names_in_lower_case": (wrapped("(1) zoey is a knight\n(2) OLIVER is a knave"), 3.0, 3.0),
    "is_an": (wrapped("(1) Zoey is an knight\n(2) Oliver is a knave"), -1.0, 3.0),
}


@pytest.mark.parametrize("response, paddlenlp_score, strict_score", KK_RULE_DIFFERENCES.values(), ids=KK_RULE_DIFFERENCES.keys())
def test_kk_matches_paddlenlp_and_kk_strict_keeps_the_stricter_rules(response, paddlenlp_score, strict_score):
    assert kk(response, task="kk") == paddlenlp_score
    assert kk(response, task="kk_strict") == strict_score


@pytest.mark.parametrize(
    "answer",
    [
        "(1) Zoey is a knight\n(2) Oliver is a knave or a knight",
        "(1) Zoey is a knight\n(2) Oliver is a knave, unless he is a knight",
        "(1) Zoey is a knight\n(2) Oliver is a knave if Zoey tells the truth",
        "(1) Zoey is a knight\n(2) Oliver is either a knight or a knave",
        "(1) Zoey is a knight\n(2) Oliver is probably a knave",
        "(1) Zoey is a knight\n(2) Oliver is a knave (maybe)",
        "Zoey is a knight; Oliver is a knave. Or Oliver is a knight",
    ],
)
def test_kk_strict_scores_an_undecided_claim_as_unparsable(answer):
    # Each of these once got kk_strict's full 3.0 ("Oliver is a knave" read as decided); kk says -1 too.
    assert kk(wrapped(answer), task="kk_strict") == -1.0


def test_kk_strict_reads_decided_claims_beside_their_clauses():
    # Other clauses may hedge; a claim's own clause decides it.
    assert kk(wrapped("Maybe Oliver lies. (1) Zoey is a knight\n(2) Oliver is a knave"), task="kk_strict") == 3.0
    assert kk(wrapped("(1) Zoey is a knight; (2) Oliver is a knave"), task="kk_strict") == 3.0


@pytest.mark.parametrize("task", KK_TASKS)
def test_kk_names_that_prefix_other_names(task):
    tgt = "(1) Ann is a knight\n(2) Anna is a knave"
    assert kk(wrapped("(1) Ann is a knight\n(2) Anna is a knave"), tgt, task=task) == 3.0
    assert kk(wrapped("(1) Anna is a knave\n(2) Ann is a knight"), tgt, task=task) == 3.0
    # Anna's role must not be read as Ann's: Ann is missing.
    assert kk(wrapped("(2) Anna is a knave"), tgt, task=task) == -1.0
    # Nor is a longer name ending in "Ann".
    assert kk(wrapped("(1) JoAnn is a knight\n(2) Anna is a knave"), tgt, task=task) == -1.0
    assert kk(wrapped("(1) Ann is a knave\n(2) Anna is a knave"), tgt, task=task) == -0.5


@pytest.mark.parametrize("task", KK_TASKS)
@pytest.mark.parametrize(
    "response",
    [
        PERFECT_ANSWER,  # no tags at all
        "reasoning <answer>" + PERFECT_ANSWER + "</answer>",  # no </think>
        "reasoning</think>\n" + PERFECT_ANSWER,  # no answer tags
        "reasoning</think>\n<answer>" + PERFECT_ANSWER,  # </answer> missing
        "reasoning</think></think>\n<answer>" + PERFECT_ANSWER + "</answer>",  # duplicated </think>
        "r</think><answer>" + PERFECT_ANSWER + "</answer><answer>" + PERFECT_ANSWER + "</answer>",  # two answers
        "<answer>" + PERFECT_ANSWER + "</answer>reasoning</think>",  # answer before </think>
        "reasoning</think>\n</answer>" + PERFECT_ANSWER + "<answer>",  # answer tags swapped
        "a</think><think>b<answer>" + PERFECT_ANSWER + "</answer>",  # a second think block opened
        "",
    ],
)
def test_kk_bad_format_scores_minus_3(task, response):
    assert kk(response, task=task) == -3.0


@pytest.mark.parametrize("task", KK_TASKS)
def test_kk_prompt_without_think_prefix_expects_the_model_to_open_it(task):
    src = chat_prompt("Zoey says ...")
    assert kk("<think>hm</think><answer>" + PERFECT_ANSWER + "</answer>", src=src, task=task) == 3.0
    assert kk(wrapped(PERFECT_ANSWER), src=src, task=task) == -3.0


@pytest.mark.parametrize("task", KK_TASKS)
def test_kk_malformed_tgt_is_an_error_naming_it(task):
    with pytest.raises(TargetError, match="Zoey is honest"):
        kk(wrapped(PERFECT_ANSWER), tgt="(1) Zoey is honest", task=task)


KK_ADVERSARIAL = {
    "repeated_answer_tags": "<answer>" * 200_000,
    "open_brackets": "</think>" + "<" * 1_000_000,
    "name_repeated": "r</think><answer>" + "Zoey " * 200_000 + "</answer>",
    "name_then_megabyte_of_spaces": "r</think><answer>" + "Zoey" + " " * 1_000_000 + "is</answer>",
    "half_claims": "r</think><answer>" + "Zoey is a " * 100_000 + "</answer>" + " " * 100_000 + "<|im_end|>",
    "glued_prefix_names": "r</think><answer>" + "Ann" * 350_000 + "</answer>",
    "text_after_megabyte_of_spaces": wrapped(PERFECT_ANSWER) + " " * 1_000_000 + "x",
}


@pytest.mark.parametrize("task", KK_TASKS)
@pytest.mark.parametrize("response", KK_ADVERSARIAL.values(), ids=KK_ADVERSARIAL.keys())
def test_kk_megabyte_adversarial_response_is_fast(task, response):
    assert len(response) >= 1_000_000
    tgt = "(1) Zoey is a knight\n(2) Ann is a knave\n(3) Anna is a knight"
    start = time.perf_counter()
    score = kk(response, tgt, task=task)
    # A linear scan takes at most 0.3 s here, alone (the suite's other worker may slow it twofold); the
    # quadratic scans these inputs once provoked took tens of seconds.
    assert time.perf_counter() - start < 2.0
    assert score in (-3.0, -1.0)


@pytest.mark.parametrize("task", KK_TASKS)
def test_kk_cost_is_linear_in_people_and_answer_length(task):
    # Once 30 s: an 850 KB answer naming 1999 people was scanned once per person.
    names = [f"Person{index}x" for index in range(1999)]
    claims = "\n".join(f"({index + 1}) {name} is a knight" for index, name in enumerate(names))
    response = wrapped(claims + " " + "y" * 800_000)
    start = time.perf_counter()
    assert kk(response, tgt=claims, task=task) == 3.0
    assert time.perf_counter() - start < 0.5


# ---------------------------------------------------------------- math


def test_math_task_is_registered_with_max_score_1():
    assert get_reward_task("math").max_score == 1.0


@pytest.mark.parametrize(
    "response, tgt",
    [
        ("6 * 200 = 1200, plus 34.\n#### 1,234", "1234"),
        ("#### 1234", "1,234"),
        ("#### $1,234.", "1234"),
        ("The total is 42.", "42"),  # no ####: the last number
        ("First 7, then 12, so the answer is 18.00", "18"),
        ("#### -5", "-5"),
        ("The temperature fell to -5 degrees", "-5"),
        ("Each costs $12.50", "12.5"),
        ("#### 0.5", "0.50"),
        ("It is -$3", "-3"),
        ("Earlier guess: 9\n####   17", "17"),
        ("# 3 #### 5 #### 8", "8"),  # the last ####
        ("#### 3<|im_end|>", "3"),
    ],
)
def test_math_right_answers_score_1(response, tgt):
    assert math_score(response, tgt) == 1.0


@pytest.mark.parametrize(
    "response, tgt",
    [
        ("#### 1,235", "1234"),
        ("#### 17\nbut maybe 18", "18"),  # the number after #### wins over later numbers
        ("The answer is 5 apples.", "-5"),
        ("between 2-3 apples", "-3"),  # a hyphen between numbers is not a minus sign
        ("There is no number here.", "0"),
        ("", "7"),
        ("#### 0.1", "0.10000000000000001"),  # exact decimals, no float rounding
    ],
)
def test_math_wrong_or_missing_answers_score_0(response, tgt):
    assert math_score(response, tgt) == 0.0


def test_math_falls_back_to_last_number_when_no_number_follows_the_mark():
    assert math_score("I think 12 ####", "12") == 1.0


GSM8K_ANSWER = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize("tgt", [GSM8K_ANSWER, "72", " 72\n", "#### 72", "so 1,000 - 928 =\n#### 72"])
def test_math_reads_gsm8k_answer_text_or_a_bare_number_as_tgt(tgt):
    assert math_score("48 + 24 = 72\n#### 72", tgt) == 1.0
    assert math_score("#### 24", tgt) == 0.0


@pytest.mark.parametrize("tgt", ["the sum of the apples", "", "####", "#### ???"])
def test_math_unreadable_tgt_is_an_error_naming_it(tgt):
    with pytest.raises(TargetError, match=re.escape(repr(tgt))):
        math_score("#### 12", tgt)


@pytest.mark.parametrize(
    "tgt, right, wrong",
    [
        ("twelve", "#### 12", "#### 13"), ("#### seventy-two", "The answer is 72.", "The answer is 27."),
        ("Monday", "It is \\boxed{\\text{monday}}", "The answer is Tuesday."), ("dark blue", "The answer is Dark Blue.", "#### blue"),
    ],
)
def test_math_reads_golds_in_words_as_numbers_or_text(tgt, right, wrong):
    assert (math_score(right, tgt), math_score(wrong, tgt)) == (1.0, 0.0)


@pytest.mark.parametrize(
    "tgt, response, score",
    [
        ("\\text{(C)}", "\\boxed{C}", 1.0), ("\\text{(C)}", "The answer is C.", 1.0), ("C", "\\boxed{(C)}", 1.0),
        ("(C)", "\\boxed{C)}", 1.0), ("C", "\\boxed{(D)}", 0.0), ("\\text{(C)}", "The answer is D.", 0.0),
    ],
)
def test_math_compares_choice_letters_with_or_without_parentheses(tgt, response, score):
    assert math_score(response, tgt) == score


@pytest.mark.parametrize(
    "tgt, response, score",
    [
        ("50\\%", "\\boxed{0.5}", 1.0), ("50\\%", "\\boxed{\\frac{1}{2}}", 1.0), ("50\\%", "\\boxed{50}", 1.0),
        ("50\\%", "\\boxed{0.05}", 0.0), ("0.5", "\\boxed{50\\%}", 1.0),
    ],
)
def test_math_reads_a_percent_on_either_side(tgt, response, score):
    assert math_score(response, tgt) == score


@pytest.mark.parametrize(
    "response, score",
    [
        ("<answer>She needs 15 more stickers.</answer>", 1.0), ("<answer>She needs 16 more stickers.</answer>", 0.0),
        ("<think>12 + 3</think><answer>It takes 15 minutes</answer>", 1.0), ("<answer>15 \\text{ stickers}</answer>", 1.0),
        ("<answer>14 or 15 stickers in all</answer>", 0.0),
    ],
)
def test_math_reads_a_sentence_inside_answer_tags_as_the_number_it_states(response, score):
    assert math_score(response, "15") == score


def test_math_tgt_past_pythons_integer_digit_limit_is_an_error_naming_it():
    """A 5,000-digit reference: Python refuses integer strings over 4,300 digits; the data loader's error (naming
    the file and line) is a TargetError, not a plain ValueError."""
    with pytest.raises(TargetError, match=r"math tgt '9999.*cannot be read: Exceeds the limit \(4300 digits\)"):
        math_score("#### 12", "9" * 5000)


@pytest.mark.parametrize("response", ["The answer is \uff0d5", "\\boxed{\uff0d5}", "so x = \uff0d5", "We get \uff0d5", "We get \u22125"])
def test_math_reads_the_full_width_and_unicode_minus_as_a_sign(response):
    assert math_score(response, "-5") == 1.0
    assert math_score(response.replace("\uff0d", "").replace("\u2212", ""), "-5") == 0.0


MATH_ADVERSARIAL = {
    "megabyte_number": "1" * 1_000_000,
    "commas": "1," * 500_000,
    "mark_then_spaces": "#### " + " " * 1_000_000,
    "signs_without_digits": "-$" * 500_000,
    "answer_after_many_numbers": "7 " * 500_000 + "#### 8",
}


@pytest.mark.parametrize("response", MATH_ADVERSARIAL.values(), ids=MATH_ADVERSARIAL.keys())
def test_math_megabyte_response_is_fast(response):
    assert len(response) >= 1_000_000
    start = time.perf_counter()
    score = math_score(response, "8")
    assert time.perf_counter() - start < 0.5
    assert score == (1.0 if response.endswith("#### 8") else 0.0)


# ---------------------------------------------------------------- arith


@pytest.mark.parametrize(
    "response, tgt, expected",
    [
        ("12", "12", 1.0),
        (" 12\n", "12", 1.0),
        ("13", "12", 0.0),
        ("12 apples", "12", 0.0),
        ("", "12", 0.0),
        ("-3", "-3", 1.0),
    ],
)
def test_arith_reward(response, tgt, expected):
    task = get_reward_task("arith")
    assert task.score("3+4+5=", tgt, response) == expected
    assert task.max_score == 1.0


# ---------------------------------------------------------------- errors naming the item


def test_rule_scorer_scores_every_row_and_names_the_row_the_task_and_the_values_it_cannot_score():
    exp = SimpleNamespace(prompts=["1+2=", "2+2=", "3+3="], labels=["3", "abc", "6"], responses=["3", "12", "6"])
    scored = RuleRewardScorer("arith").score(exp)
    assert scored.scores == [1.0, 0.0, 1.0]  # the bad row gets the rule's min score, the others theirs
    assert scored.errors == [
        (1, "reward 'arith' cannot score item 1 (src='2+2=', tgt='abc', response='12'): TargetError: arith tgt 'abc' is not an integer")
    ]


def test_unscorable_item_shows_long_values_cut_with_their_length():
    scored = get_reward_task("arith").score_batch(["1+2="], ["x" * 5000], ["12"])
    message = scored.errors[0][1]
    assert f"tgt={'x' * 200!r}... (5000 chars), response='12'" in message
    assert len(message) < 800  # the ValueError quoting the whole tgt is cut as well


def test_a_rule_that_raises_or_gives_a_non_finite_score_fails_only_its_row():
    task = get_reward_task("arith")

    def flaky(src, tgt, response):
        if response == "boom":
            raise RuntimeError("rule bug")
        return float("nan") if response == "nan" else 1.0

    flaky_task = type(task)("flaky", flaky, 1.0, -1.0, task.read_target, {})
    scored = flaky_task.score_batch(["a"] * 3, ["1"] * 3, ["ok", "boom", "nan"])
    assert scored.scores == [1.0, -1.0, -1.0]
    assert [index for index, _ in scored.errors] == [1, 2]
    assert "RuntimeError: rule bug" in scored.errors[0][1]
    assert "non-finite score" in scored.errors[1][1]


# ---------------------------------------------------------------- gsm8k_strict and math_think_answer


@pytest.mark.parametrize(
    "response, expected",
    [
        ("48 + 24 = 72\n#### 72", 1.0),
        ("#### 1,234", 0.0),  # the reference is 72
        ("The answer is \\boxed{72}.", 0.0),  # no ####: the strict rule pays nothing
        ("####72", 0.0),  # "#### " with its space, as the rule's users reproduce it
        ("#### 71\n#### 72", 1.0),  # the last mark
        ("#### 72" + " filler" * 100, 0.0),  # the mark must be in the last 300 characters
        ("#### 72.0", 0.0),  # the reference's string, not its value
    ],
)
def test_gsm8k_strict_pays_only_the_last_hash_mark_equal_to_the_reference_string(response, expected):
    assert get_reward_task("gsm8k_strict").score("q", "so 48+24 = 72\n#### 72", response) == expected


def test_gsm8k_strict_refuses_a_reference_that_is_not_a_number():
    with pytest.raises(TargetError, match="gsm8k_strict tgt"):
        get_reward_task("gsm8k_strict").check_target("\\frac{3}{4}")


@pytest.mark.parametrize(
    "src, response, answer, format_",
    [
        ("q", "<think>48 + 24 = 72</think>\n<answer>72</answer>", 1.0, 1.25),
        ("q", "<think>48 + 24 = 72</think>\n<answer>72</answer><|im_end|>", 1.0, 1.25),
        ("q <think>", "48 + 24 = 72</think>\n<answer>72</answer>", 1.0, 1.25),  # the prompt opened <think>
        ("q", "<think>48 + 24 = 72</think>\n<answer>73</answer>", -1.0, 1.25),
        ("q", "48 + 24 = 72\n#### 72", 1.0, -1.0),  # right answer, wrong form
        ("q", "Sure! <think>x</think><answer>72</answer>", 1.0, -1.0),  # text before <think>
        ("q", "<think>x</think> So: <answer>72</answer>", 1.0, -1.0),  # text between the blocks
        ("q", "<think>x</think><answer>72</answer> Done.", 1.0, -1.0),  # text after </answer>
        ("q", "<think>x</think><answer>72</answer><answer>72</answer>", 1.0, -1.0),  # a tag twice
    ],
)
def test_math_think_answer_pays_the_answer_and_the_exact_format_as_parts(src, response, answer, format_):
    task = get_reward_task("math_think_answer")
    assert task.score(src, "72", response) == {"answer": answer, "format": format_}
    scored = task.score_batch([src], ["72"], [response])
    assert scored.scores == [answer + format_] and scored.parts == {"answer": [answer], "format": [format_]}
    assert (task.max_score, task.min_score) == (2.25, -2.0)
