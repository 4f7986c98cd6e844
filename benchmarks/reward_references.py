"""Graders written elsewhere that bench_rewards.py (and the tests) compare the rule rewards with.

- `math_verify_correct`: Hugging Face's math-verify as verl's `math_verify` reward calls it: the reference
  wrapped in `\\boxed{}` and parsed for LaTeX, the response parsed for LaTeX and plain expressions, with
  math-verify's own timeouts (main thread only). None when math-verify is not installed.
- `paddlenlp_math_correct`: the rule of PaddleNLP's math reward server (the same file, its GSM8K
  version): the last run of digits, dots and commas of the response, as a string, equals the reference's.
- `paddlenlp_kk_score`: the scoring of PaddleNLP's kk reward server (llm/alignment/ppo/reward_server.py
  there), rewritten here from its behaviour: it always puts `<think>` before the response, reads a tgt
  line's first word and role, and takes each person's first "NAME is a knight/knave".
"""

import re

PADDLENLP_TURN = "\n<|im_start|>assistant\n<think>"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def math_verify_correct(tgt, response):
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        return None
    try:
        gold = parse(f"\\boxed{{{tgt}}}", extraction_config=[LatexExtractionConfig()])
        answer = parse(response, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()])
        return bool(gold and answer and verify(gold, answer))
    except Exception:  # a timeout or a parse error: graded wrong, as verl does
        return False


def paddlenlp_math_correct(tgt, response):
    def last_number(text):
        numbers = [number for number in re.findall(r"(-?[0-9.,]+)", text) if number not in ("", ".")]
        return numbers[-1] if numbers else None

    answer = last_number(response)
    return answer is not None and answer == last_number(tgt)


def paddlenlp_kk_score(src, tgt, response):
    text = response if PADDLENLP_TURN in response else PADDLENLP_TURN + response
    text = text.split("<|im_start|>assistant", 1)[1]
    roles = {}
    for line in filter(None, (line.strip() for line in tgt.split("\n"))):
        match = re.search(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", line, re.IGNORECASE)
        if match:
            roles[match[1]] = match[2].lower()
    positions = [text.find(tag) for tag in TAGS]
    well_formed = all(text.count(tag) == 1 for tag in TAGS) and positions == sorted(positions)
    answers = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    answer = answers[-1].strip() if answers else ""
    return (1.0 if well_formed else -1.0) + (judge_like_paddlenlp(answer, roles) if well_formed and answer else -2.0)


def judge_like_paddlenlp(answer, roles):
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(roles):
        return -2.0
    predicted = {}
    for name in roles:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer, re.IGNORECASE)
        if match is None:
            return -2.0
        predicted[name] = match[1].lower()
    return 2.0 if predicted == roles else -1.5
