"""The rule rewards on the labelled cases of tests/data/reward_cases (GSM8K- and MATH-style answers as
models write them, knights-and-knaves answers), each with the verdict a person grading would give."""

import json
import os
import sys
import threading
import time
from collections import Counter

import pytest

from helpers import REPO_ROOT
from paddle_alignment.rewards import get_reward_task, symbolic

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
from reward_references import math_verify_correct, paddlenlp_kk_score  # noqa: E402

CASES = os.path.join(REPO_ROOT, "tests", "data", "reward_cases")


def load(name):
    with open(os.path.join(CASES, name), encoding="utf-8") as file:
        return [json.loads(line) for line in file]


MATH_CASES = load("math.jsonl")
KK_CASES = load("kk.jsonl")


@pytest.fixture
def short_deadline():
    """Symbolic comparisons ended after 1 s (the power-tower case would hold 5 s)."""
    shared = symbolic.configure(deadline=1.0)
    yield shared
    symbolic.configure()


def correct(task_name, case):
    task = get_reward_task(task_name)
    return task.is_correct(task.score(case.get("src", ""), case["tgt"], case["response"]))


def test_the_case_sets_cover_every_class_of_the_issue():
    assert len(MATH_CASES) >= 300 and len(KK_CASES) >= 80
    classes = Counter(case["class"] for case in MATH_CASES)
    for name in ("boxed_then_check", "hedge_or", "correction_box", "form_thousands", "form_unicode_minus", "form_units",
                 "form_scientific", "form_latex_fraction", "math_equivalent", "adversarial_power_tower", "gsm8k_mark_then_text"):
        assert classes[name] >= 1, name
    assert sum(case["correct"] for case in MATH_CASES) not in (0, len(MATH_CASES))


def test_math_rule_is_right_on_at_least_97_percent_of_the_labelled_cases(short_deadline):
    wrong = [case for case in MATH_CASES if correct("math", case) != case["correct"]]
    assert len(wrong) <= 0.03 * len(MATH_CASES), [(case["id"], case["class"]) for case in wrong]


@pytest.mark.slow
def test_math_rule_is_right_more_often_than_math_verify(short_deadline):
    ours = [correct("math", case) == case["correct"] for case in MATH_CASES]
    theirs = [math_verify_correct(case["tgt"], case["response"]) == case["correct"] for case in MATH_CASES]
    assert sum(ours) > sum(theirs)
    # Where math-verify is right and the rule is not, the response hedges ("12 or so").
    assert {case["class"] for case, mine, other in zip(MATH_CASES, ours, theirs) if other and not mine} <= {"realistic_phrasing"}


def test_a_hung_parse_ends_at_its_deadline_in_a_worker_thread_with_a_score_and_a_counted_warning(short_deadline, caplog):
    # Against a number the tower is graded at once (it is too large to be one); against a root it is parsed.
    case = {**next(case for case in MATH_CASES if case["class"] == "adversarial_power_tower"), "tgt": "\\sqrt{2}"}
    short_deadline.equal("1", "1")  # start a worker: its start-up is not part of the deadline
    results = []

    def grade():
        started = time.perf_counter()
        results.append((get_reward_task("math").score("", case["tgt"], case["response"]), time.perf_counter() - started))

    thread = threading.Thread(target=grade)
    thread.start()
    thread.join(timeout=30)
    [(score, seconds)] = results
    assert score == 0.0 and 1.0 <= seconds < 3.0
    assert short_deadline.misses == 1
    assert any("passed its 1s deadline (1 so far" in record.getMessage() for record in caplog.records)
    # The killed worker is replaced: the next comparison is answered.
    assert short_deadline.equal("\\frac{3}{4}", "0.75") is True


def test_kk_strict_is_right_on_every_labelled_case():
    assert [case["id"] for case in KK_CASES if correct("kk_strict", case) != case["correct"]] == []


def test_kk_scores_like_paddlenlp_except_where_its_docstring_says():
    kk = get_reward_task("kk")
    differing = {
        case["class"]
        for case in KK_CASES
        if kk.score(case["src"], case["tgt"], case["response"]) != paddlenlp_kk_score(case["src"], case["tgt"], case["response"])
    }
    # PaddleNLP's server puts <think> before every response, whatever the prompt.
    assert differing == {"right_response_opens_think"}


def test_every_case_of_the_forms_the_second_review_found_misread_is_graded_right(short_deadline):
    cases = [case for case in MATH_CASES if case.get("set") == "second_review_forms"]
    assert len({case["class"] for case in cases}) >= 14 and len(cases) >= 50
    assert [(case["id"], case["class"]) for case in cases if correct("math", case) != case["correct"]] == []


def test_kk_cases_with_names_in_other_cases_and_references_without_numbering_are_graded_right():
    classes = {"name_other_case", "reference_full_stops", "reference_unnumbered"}
    cases = [case for case in KK_CASES if case["class"] in classes]
    assert {case["class"] for case in cases} == classes
    assert [case["id"] for case in cases for task in ("kk", "kk_strict") if correct(task, case) != case["correct"]] == []
