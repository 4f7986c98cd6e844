"""Accuracy and cost of the rule rewards on the labelled cases of tests/data/reward_cases/.

    python benchmarks/bench_rewards.py [--show_differences]

math.jsonl: each case is graded by the `math` rule (as the reward server does: rows scored in a thread,
symbolic comparisons in worker processes with their deadline) and, when it is installed, by Hugging
Face's math-verify as verl's `math_verify` reward calls it (the reference wrapped in `\\boxed{}`, the
response parsed for LaTeX and plain expressions, its own 5 s timeouts). It prints each grader's accuracy,
the cases each gets wrong or where they differ, and the `math` rule's cost per response (median, 99th
percentile, worst). kk.jsonl: the accuracy of `kk` and `kk_strict` against the cases' verdicts, and
where `kk` and PaddleNLP's kk server (benchmarks/reward_references.py) score a case differently.
"""

import argparse
import json
import logging
import os
import sys
import threading
import time

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path[:0] = [os.path.join(REPO_ROOT, "llm"), REPO_ROOT]

from paddle_alignment.rewards import get_reward_task  # noqa: E402
from reward_references import math_verify_correct, paddlenlp_kk_score, paddlenlp_math_correct  # noqa: E402

CASES = os.path.join(REPO_ROOT, "tests", "data", "reward_cases")


def load_cases(name):
    with open(os.path.join(CASES, name), encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def grade_with_rule(task_name, cases):
    """(verdicts, seconds per case) of the rule, scored off the main thread as in the reward server."""
    task = get_reward_task(task_name)
    verdicts, seconds = [], []

    def run():
        for case in cases:
            started = time.perf_counter()
            score = task.score_item(case["id"], case.get("src", ""), case["tgt"], case["response"])
            seconds.append(time.perf_counter() - started)
            verdicts.append(task.is_correct(sum(score.values())))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return verdicts, seconds


def grade_with_math_verify(cases):
    verdicts = [math_verify_correct(case["tgt"], case["response"]) for case in cases]
    return None if None in verdicts else verdicts


def shown(case, width=110):
    response = case["response"] if len(case["response"]) <= width else f"...{case['response'][-width:]} ({len(case['response'])} chars)"
    return f"#{case['id']} [{case['class']}] tgt={case['tgt'][:40]!r} expected={case['correct']} response={response!r}"


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report_rule_on_its_references(task_name, cases):
    """A rule's accuracy on the cases whose reference it reads (gsm8k_strict reads numbers only)."""
    task = get_reward_task(task_name)
    readable = []
    for case in cases:
        try:
            task.check_target(case["tgt"])
            readable.append(case)
        except ValueError:
            pass
    verdicts, _ = grade_with_rule(task_name, readable)
    right = sum(v == c["correct"] for v, c in zip(verdicts, readable))
    print(f"  {task_name} (on the {len(readable)} cases with a number as reference): {right}/{len(readable)} right = {right / len(readable):.1%}")


def report_math(show_differences):
    """Prints the figures; returns (the rule's accuracy, math-verify's or None)."""
    cases = load_cases("math.jsonl")
    ours, seconds = grade_with_rule("math", cases)
    theirs = grade_with_math_verify(cases)
    expected = [case["correct"] for case in cases]
    right = sum(v == e for v, e in zip(ours, expected))
    print(f"math cases: {len(cases)}")
    print(f"  math rule:   {right}/{len(cases)} right = {right / len(cases):.1%}")
    theirs_right = None
    if theirs is not None:
        theirs_right = sum(v == e for v, e in zip(theirs, expected))
        print(f"  math-verify: {theirs_right}/{len(cases)} right = {theirs_right / len(cases):.1%}")
    else:
        print("  math-verify: not installed (pip install math-verify) - no comparison")
    paddlenlp_right = sum(paddlenlp_math_correct(c["tgt"], c["response"]) == c["correct"] for c in cases)
    print(f"  PaddleNLP's math server rule (last number, as a string): {paddlenlp_right}/{len(cases)} right = {paddlenlp_right / len(cases):.1%}")
    report_rule_on_its_references("gsm8k_strict", cases)
    milliseconds = [s * 1000 for s in seconds]
    print(
        f"  cost of the math rule per response: median {percentile(milliseconds, 0.5):.2f} ms, "
        f"p99 {percentile(milliseconds, 0.99):.1f} ms, worst {max(milliseconds):.1f} ms "
        f"(#{cases[milliseconds.index(max(milliseconds))]['id']})"
    )
    if theirs is not None:
        report_sets(cases, ours, theirs)
    print("  wrong under the math rule:")
    for case, verdict in zip(cases, ours):
        if verdict != case["correct"]:
            print("    " + shown(case))
    if theirs is not None and show_differences:
        print("  where math-verify and the math rule differ (rule's verdict, math-verify's):")
        for case, mine, other in zip(cases, ours, theirs):
            if mine != other:
                print(f"    rule={mine} math-verify={other} " + shown(case))
    return right / len(cases), None if theirs_right is None else theirs_right / len(cases)


def report_sets(cases, ours, theirs):
    """The rule and math-verify on each named set of cases (a case's "set": the held-out sets, the forms a review
    found misread)."""
    for name in sorted({case["set"] for case in cases if "set" in case}):
        members = [i for i, case in enumerate(cases) if case.get("set") == name]
        mine = sum(ours[i] == cases[i]["correct"] for i in members)
        other = sum(theirs[i] == cases[i]["correct"] for i in members)
        print(f"  set {name}: math rule {mine}/{len(members)}, math-verify {other}/{len(members)}")


def report_budget():
    """One request of 16 power towers and 3 ordinary rows to the reward server (in this process) at its defaults:
    seconds to the answer, and the ordinary rows' scores."""
    import requests
    from werkzeug.serving import make_server

    from llm.alignment.ppo.reward_server import create_app

    server = make_server("127.0.0.1", 0, create_app("math"), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = {
        "src": ["q"] * 19,
        "tgt": ["\\sqrt{2}"] * 16 + ["5", "\\frac{3}{4}", "12"],  # a root: the towers go to SymPy (a number would not)
        "response": ["\\boxed{9^{9^{9^{9}}}}"] * 16 + ["\\boxed{5}", "The answer is 0.75.", "#### 13"],
    }
    started = time.perf_counter()
    answer = requests.post(f"http://127.0.0.1:{server.server_port}/", json=body, timeout=120).json()
    seconds = time.perf_counter() - started
    server.shutdown()
    print(
        f"budget: 16 power towers + 3 ordinary rows answered in {seconds:.1f} s; ordinary rows scored "
        f"{answer['score'][16:]} (expected [1.0, 1.0, 0.0]); {len(answer.get('row_errors', []))} rows past the budget"
    )


def report_kk():
    cases = load_cases("kk.jsonl")
    print(f"kk cases: {len(cases)}")
    for task_name in ("kk", "kk_strict"):
        verdicts, _ = grade_with_rule(task_name, cases)
        right = sum(v == c["correct"] for v, c in zip(verdicts, cases))
        print(f"  {task_name:9s}: {right}/{len(cases)} right = {right / len(cases):.1%}")
        for case, verdict in zip(cases, verdicts):
            if verdict != case["correct"]:
                print("    " + shown(case))
    kk = get_reward_task("kk")
    differing = [case for case in cases if kk.score(case["src"], case["tgt"], case["response"]) != paddlenlp_kk_score(case["src"], case["tgt"], case["response"])]
    print(f"  kk scores like PaddleNLP's kk server on {len(cases) - len(differing)}/{len(cases)}; differently on:")
    for case in differing:
        print("    " + shown(case))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show_differences", action="store_true", help="list every case where math-verify differs")
    parser.add_argument("--budget", action="store_true", help="also time a request of 16 power towers (about 20 s)")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs each timeout with the whole input
    if args.budget:
        report_budget()
    report_kk()
    ours, theirs = report_math(args.show_differences)
    print(f"math_accuracy={ours:.3f}" + ("" if theirs is None else f" math_verify_accuracy={theirs:.3f}"))


if __name__ == "__main__":
    main()
