"""The LLM judge (rewards/judge.py): its prompt, the verdicts it reads and the ones it cannot, its record in
checkpoints; a local model and a server as judges end to end are in tests/llm/alignment/ppo/test_grpo_e2e.py."""

import json
import re

import pytest

from paddle_alignment.experience import Experience
from paddle_alignment.rewards.judge import (
    DEFAULT_TEMPLATE, DEFAULT_VERDICT_PATTERN, JudgeScorer, LocalJudge, check_judge_record, fill, read_verdict,
    save_judge_record,
)


def texts(prompts, responses, labels):
    return Experience(None, None, None, None, None, prompts, labels, responses)


def test_the_template_gets_the_rollouts_texts_and_keeps_other_braces():
    template = 'Q: {prompt}\nA: {response}\nRef: {reference}\nAnswer as {"score": [[n]]}'
    filled = fill(template, "2+{x}=", "7 {response}", "7")
    assert filled == 'Q: 2+{x}=\nA: 7 {response}\nRef: 7\nAnswer as {"score": [[n]]}'  # a response's braces stay text
    assert "{prompt}" in DEFAULT_TEMPLATE and "[[1]]" in DEFAULT_TEMPLATE


def test_a_verdict_is_the_first_group_of_the_pattern_and_anything_else_is_none():
    pattern = re.compile(DEFAULT_VERDICT_PATTERN)
    assert read_verdict("The response is right. [[1]]", pattern) == 1.0
    assert read_verdict("score [[7.5]] then [[2]]", pattern) == 7.5
    for reply in ("[[high]]", "1", "[1]", ""):
        assert read_verdict(reply, pattern) is None
    assert read_verdict("Verdict: yes", re.compile(r"Verdict: (\w+)")) is None  # a group that is not a number


class ScriptedJudge(LocalJudge):
    def __init__(self, replies):
        super().__init__(None, None, DEFAULT_VERDICT_PATTERN, 8, 4, decode=None)
        self.scripted, self.asked = replies, []

    def replies(self, requests):
        self.asked += requests
        return self.scripted


def test_a_reply_without_a_verdict_is_an_error_row_never_a_score():
    judge = ScriptedJudge(["fine [[1]]", "I cannot tell", "[[0]]"])
    scorer = JudgeScorer(judge, "{prompt} | {response} | {reference}", {"judge": "model:/j"})
    scored = scorer.score(texts(["a", "b", "c"], ["x", "y", "z"], ["1", "2", "3"]))
    assert judge.asked == ["a | x | 1", "b | y | 2", "c | z | 3"]
    assert scored.scores[0] == 1.0 and scored.scores[2] == 0.0
    assert [row for row, _ in scored.errors] == [1] and "no verdict: 'I cannot tell'" in scored.errors[0][1]
    assert scorer.excludes_unscored


def test_a_template_that_hides_the_response_is_refused():
    with pytest.raises(ValueError, match="judge_prompt_template has no {response}"):
        JudgeScorer(ScriptedJudge([]), "Is {prompt} hard?", {"judge": "model:/j"})


def test_a_checkpoint_resumes_only_with_the_judge_and_prompt_it_was_trained_with(tmp_path):
    first = JudgeScorer(ScriptedJudge([]), DEFAULT_TEMPLATE, {"judge": "server:http://judge:1"})
    save_judge_record(first, tmp_path)
    record = json.loads((tmp_path / "judge.json").read_text())
    assert record["judge"] == "server:http://judge:1" and len(record["prompt_sha256"]) == 64
    check_judge_record(JudgeScorer(ScriptedJudge([]), DEFAULT_TEMPLATE, {"judge": "server:http://judge:1"}), tmp_path)
    reworded = JudgeScorer(ScriptedJudge([]), DEFAULT_TEMPLATE + " Be strict.", {"judge": "server:http://judge:1"})
    with pytest.raises(ValueError, match="another judge or prompt \\(prompt_sha256 differ"):
        check_judge_record(reworded, tmp_path)
    with pytest.raises(ValueError, match="trained with the judge server:http://judge:1; this run scores without one"):
        check_judge_record(object(), tmp_path)
