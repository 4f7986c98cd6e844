import json
import logging
import os
import signal
import subprocess
import sys
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests

from flask import Flask, jsonify, request

from paddle_alignment import watchdog
from paddle_alignment.rewards import client as reward_client
from paddle_alignment.rewards.client import RewardServerClient, RewardServerError
from helpers import REPO_ROOT, protocol_only_app, running_reward_server, serving, serving_in_production, small_run_argv
from llm.alignment.ppo import run_ppo
from llm.alignment.ppo.reward_server import API_KEY_ENV, create_app
from paddle_alignment.rewards import REWARD_TASKS, RewardTask
from paddle_alignment.rewards.scoring import ServerRewardScorer, build_reward_scorer

TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")

MAX_BATCH = 8
MAX_CONTENT_LENGTH = 16 * 1024
MAX_ITEM_CHARS = 4096

TGT = "(1) Zoey is a knight\n(2) Oliver is a knave"
RIGHT = "Zoey is honest.</think>\n<answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer><|im_end|>"
WRONG_ROLE = "Hmm.</think>\n<answer>(1) Zoey is a knave\n(2) Oliver is a knave</answer>"
NO_TAGS = "Zoey is a knight and Oliver is a knave."
SRC = "<|im_start|>user\nZoey says ...<|im_end|>\n<|im_start|>assistant\n<think>"


@pytest.fixture(scope="module")
def server_url():
    """The kk reward app as reward_server.py serves it (waitress)."""
    app = create_app("kk", max_batch=MAX_BATCH, max_content_length=MAX_CONTENT_LENGTH, max_item_chars=MAX_ITEM_CHARS)
    with serving_in_production(app) as url:
        yield url


def post(url, body, **kwargs):
    data = body if isinstance(body, (bytes, str, Iterator)) else json.dumps(body)
    return requests.post(url + "/", data=data, headers={"Content-Type": "application/json"}, timeout=10, **kwargs)


def batch(*responses):
    return {"src": [SRC] * len(responses), "tgt": [TGT] * len(responses), "response": list(responses)}


def assert_error(answer, status, *words):
    assert answer.status_code == status
    body = answer.json()
    assert set(body) == {"error_code", "error_msg", "score"}
    assert body["error_code"] != 0 and isinstance(body["error_code"], int)
    assert body["score"] == []
    for word in words:
        assert word in body["error_msg"]


def test_scores_a_batch(server_url):
    answer = post(server_url, batch(RIGHT, WRONG_ROLE, NO_TAGS))
    assert answer.status_code == 200
    assert answer.json() == {"error_code": 0, "error_msg": "Success", "score": [3.0, -0.5, -3.0]}


def test_empty_batch_gets_empty_scores(server_url):
    assert post(server_url, batch()).json() == {"error_code": 0, "error_msg": "Success", "score": []}


def test_health(server_url):
    answer = requests.get(server_url + "/health", timeout=10)
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok", "task": "kk", "max_score": 3.0, "min_score": -3.0, "parts": {}, "grading_budget": 20.0}


BAD_REQUESTS = {
    "malformed_json": ('{"src": [', 400, ["not valid JSON"]),
    "not_utf8": (b"\xff\xfe{}", 400, ["not valid JSON"]),
    "body_is_a_list": ([1, 2], 400, ["JSON object", "array"]),
    "missing_key": ({"src": [SRC], "tgt": [TGT]}, 400, ["'response'"]),
    "value_not_a_list": ({"src": SRC, "tgt": [TGT], "response": [RIGHT]}, 400, ["'src'", "list of strings", "string"]),
    "unequal_lengths": (
        {"src": [SRC] * 2, "tgt": [TGT] * 3, "response": [RIGHT] * 2},
        400,
        ["src=2", "tgt=3", "response=2"],
    ),
    "batch_too_large": (batch(*[RIGHT] * (MAX_BATCH + 1)), 413, [f"{MAX_BATCH + 1} items", f"max_batch={MAX_BATCH}"]),
    "body_too_large": (batch("x" * (MAX_CONTENT_LENGTH + 1)), 413, [f"max_content_length={MAX_CONTENT_LENGTH}"]),
    "nested_too_deeply": ("[" * 8000 + "]" * 8000, 400, ["nested too deeply"]),
}


@pytest.mark.parametrize("body, status, words", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_requests_get_json_errors_and_the_server_keeps_serving(server_url, body, status, words):
    assert_error(post(server_url, body), status, *words)
    assert post(server_url, batch(RIGHT)).json()["score"] == [3.0]


def test_chunked_body_over_the_limit_is_refused_not_truncated(server_url):
    body = json.dumps(batch("x" * MAX_CONTENT_LENGTH)).encode()
    chunks = (body[start : start + 1024] for start in range(0, len(body), 1024))
    assert_error(post(server_url, chunks), 413, f"max_content_length={MAX_CONTENT_LENGTH}")
    small = json.dumps(batch(RIGHT)).encode()
    assert post(server_url, iter([small[:10], small[10:]])).json()["score"] == [3.0]


MALFORMED_ROWS = {
    "response_not_a_string": ([SRC, SRC, SRC], [TGT, TGT, TGT], [RIGHT, 7, RIGHT], "item 1: response must be a string, got number"),
    "null_src": ([SRC, None, SRC], [TGT, TGT, TGT], [RIGHT, RIGHT, RIGHT], "item 1: src must be a string, got null"),
    "tgt_too_long": (
        [SRC] * 3, [TGT, "x" * (MAX_ITEM_CHARS + 1), TGT], [RIGHT] * 3,
        f"tgt has {MAX_ITEM_CHARS + 1} characters, over max_item_chars={MAX_ITEM_CHARS}",
    ),
    "unreadable_tgt": ([SRC] * 3, [TGT, "nonsense", TGT], [RIGHT] * 3, "item 1 (src=" + repr(SRC) + ", tgt='nonsense'"),
}


@pytest.mark.parametrize("src, tgt, response, words", MALFORMED_ROWS.values(), ids=MALFORMED_ROWS.keys())
def test_a_malformed_row_gets_min_score_and_an_error_and_the_other_rows_their_scores(server_url, src, tgt, response, words, caplog):
    with caplog.at_level(logging.WARNING, logger="llm.alignment.ppo.reward_server"):
        answer = post(server_url, {"src": src, "tgt": tgt, "response": response})
    assert answer.status_code == 200
    body = answer.json()
    assert body["error_code"] == 0 and body["error_msg"] == "1 of 3 rows could not be scored and got min_score -3"
    assert body["score"] == [3.0, -3.0, 3.0]
    [row_error] = body["row_errors"]
    assert row_error["index"] == 1 and row_error["error_msg"].startswith("reward 'kk' cannot score item 1")
    assert words in row_error["error_msg"]
    assert any(words in record.getMessage() for record in caplog.records)


def test_a_response_of_any_length_is_scored(server_url):
    long_right = "x" * (MAX_ITEM_CHARS * 2) + RIGHT
    assert post(server_url, batch(long_right, RIGHT)).json() == {"error_code": 0, "error_msg": "Success", "score": [3.0, 3.0]}


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/nowhere", 404),
        ("POST", "/score", 404),
        ("GET", "/", 405),
        ("PUT", "/", 405),
        ("POST", "/health", 405),
    ],
)
def test_unknown_paths_and_methods_get_json_errors(server_url, method, path, status):
    answer = requests.request(method, server_url + path, timeout=10)
    assert_error(answer, status, path)


def test_fifty_concurrent_requests_all_answered_correctly(server_url):
    cases = [(RIGHT, 3.0), (WRONG_ROLE, -0.5), (NO_TAGS, -3.0)]

    def score_one(index):
        responses = [cases[(index + offset) % 3][0] for offset in range(index % MAX_BATCH + 1)]
        expected = [cases[(index + offset) % 3][1] for offset in range(index % MAX_BATCH + 1)]
        return post(server_url, batch(*responses)).json()["score"], expected

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(score_one, range(50)))
    assert len(results) == 50
    for scores, expected in results:
        assert scores == expected


# ---------------------------------------------------------------- client


def test_client_health_and_score(server_url):
    client = RewardServerClient(server_url, timeout=5)
    assert client.health() == {"status": "ok", "task": "kk", "max_score": 3.0, "min_score": -3.0, "parts": {}, "grading_budget": 20.0}
    scored = client.score([SRC] * 3, [TGT] * 3, [RIGHT, WRONG_ROLE, NO_TAGS])
    assert (scored.scores, scored.parts, scored.errors) == ([3.0, -0.5, -3.0], {}, [])


def test_client_raises_at_once_on_4xx(server_url, monkeypatch):
    sleeps = []
    monkeypatch.setattr(reward_client.time, "sleep", sleeps.append)
    client = RewardServerClient(server_url, timeout=5, max_retries=3, backoff=1.0)
    with pytest.raises(RewardServerError, match=r"HTTP 400: src, tgt and response must have the same length"):
        client.score([SRC], [TGT, TGT], [RIGHT])
    with pytest.raises(RewardServerError, match=r"HTTP 413: .*max_batch=8"):
        client.score([SRC] * 9, [TGT] * 9, [RIGHT] * 9)
    assert sleeps == []


@contextmanager
def counting_requests(app):
    """Serve `app`; yields its URL and the list of paths it received, filled as requests arrive."""
    received = []
    app.before_request(lambda: received.append(request.path))
    with serving(app) as url:
        yield url, received


def scripted_app(*answers):
    """A server answering POST / with each (status, body) of `answers` in turn, the last one from then on;
    a dict body goes as JSON, a str as plain text."""
    app, queue = Flask(__name__), list(answers)

    @app.post("/")
    def answer():
        status, body = queue.pop(0) if len(queue) > 1 else queue[0]
        return (jsonify(body), status) if isinstance(body, dict) else (body, status, {"Content-Type": "text/plain"})

    return app


@pytest.fixture
def retry_warnings():
    """Warnings the client logs. paddlenlp's logger does not propagate to the root logger, so caplog misses it."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    paddlenlp_logger = logging.getLogger("PaddleNLP")
    paddlenlp_logger.addHandler(handler)
    yield records
    paddlenlp_logger.removeHandler(handler)


ARITH_BATCH = (["1+2=", "2+2=", "3+2=", "4+2="], ["3", "4", "5", "abc"], ["3", "4", "5", "12"])


def test_server_names_the_row_whose_tgt_the_rule_cannot_read_and_its_values():
    with running_reward_server("arith") as url:
        src, tgt, response = ARITH_BATCH
        body = post(url, {"src": src, "tgt": tgt, "response": response}).json()
    assert body["score"] == [1.0, 1.0, 1.0, 0.0]
    item = "item 3 (src='4+2=', tgt='abc', response='12')"
    assert body["row_errors"] == [{"index": 3, "error_msg": f"reward 'arith' cannot score {item}: TargetError: arith tgt 'abc' is not an integer"}]


def failing_task(name, score):
    return RewardTask(name, score, 1.0, -1.0, str, {})


def test_server_names_the_row_a_rule_fails_on_and_scores_the_others(monkeypatch):
    def fails_on_bad(src, tgt, response):
        if response == "bad":
            raise KeyError("lookup table")
        return 1.0

    monkeypatch.setitem(REWARD_TASKS, "fails_on_bad", failing_task("fails_on_bad", fails_on_bad))
    with running_reward_server("fails_on_bad") as url:
        body = post(url, {"src": ["a", "b"], "tgt": ["x", "y"], "response": ["good", "bad"]}).json()
    assert body["score"] == [1.0, -1.0]
    assert "cannot score item 1 (src='b', tgt='y', response='bad'): KeyError: 'lookup table'" in body["row_errors"][0]["error_msg"]


def test_server_names_the_row_given_a_non_finite_score(monkeypatch):
    nan_on_bad = failing_task("nan_on_bad", lambda src, tgt, response: float("nan") if response == "bad" else 1.0)
    monkeypatch.setitem(REWARD_TASKS, "nan_on_bad", nan_on_bad)
    with running_reward_server("nan_on_bad") as url:
        body = post(url, {"src": ["a", "b"], "tgt": ["x", "y"], "response": ["good", "bad"]}).json()
    assert body["score"] == [1.0, -1.0]
    assert "non-finite score {'': nan} to item 1 (src='b', tgt='y', response='bad')" in body["row_errors"][0]["error_msg"]


def test_client_returns_row_errors_without_retrying(monkeypatch, retry_warnings):
    sleeps = []
    monkeypatch.setattr(reward_client.time, "sleep", sleeps.append)
    with counting_requests(create_app("arith")) as (url, received):
        client = RewardServerClient(url, timeout=5, max_retries=3, backoff=0)
        scored = client.score(*ARITH_BATCH)
    assert scored.scores == [1.0, 1.0, 1.0, 0.0]
    assert [index for index, _ in scored.errors] == [3] and "tgt='abc'" in scored.errors[0][1]
    assert received == ["/"] and sleeps == [] and retry_warnings == []


def test_client_does_not_retry_a_protocol_500():
    internal_error = {"error_code": 500, "error_msg": "internal error: RuntimeError: disk full", "score": []}
    with counting_requests(scripted_app((500, internal_error))) as (url, received):
        client = RewardServerClient(url, timeout=5, max_retries=3, backoff=0)
        with pytest.raises(RewardServerError, match=r"HTTP 500: internal error: RuntimeError: disk full"):
            client.score(["1+2="], ["3"], ["3"])
    assert received == ["/"]


def test_client_retries_a_503_from_a_proxy_and_logs_each_retry_with_its_cause(monkeypatch, retry_warnings):
    sleeps = []
    monkeypatch.setattr(reward_client.time, "sleep", sleeps.append)
    success = {"error_code": 0, "error_msg": "Success", "score": [1.0]}
    app = scripted_app((503, "upstream down"), (503, "upstream down"), (200, success))
    with counting_requests(app) as (url, received):
        client = RewardServerClient(url, timeout=5, max_retries=3, backoff=0.5)
        assert client.score(["1+2="], ["3"], ["3"]).scores == [1.0]
    assert len(received) == 3 and sleeps == [0.5, 1.0]
    messages = [record.getMessage() for record in retry_warnings]
    assert len(messages) == 2 and all(record.levelno == logging.WARNING for record in retry_warnings)
    for attempt, (message, wait) in enumerate(zip(messages, ["0.5s", "1s"]), start=1):
        assert f"attempt {attempt}/4 failed (HTTP 503: upstream down); retrying in {wait}" in message


def test_client_retries_a_non_protocol_5xx_then_gives_up_with_the_last_error(monkeypatch):
    monkeypatch.setattr(reward_client.time, "sleep", lambda seconds: None)
    with counting_requests(scripted_app((502, "Bad Gateway"))) as (url, received):
        client = RewardServerClient(url, timeout=5, max_retries=2, backoff=0)
        with pytest.raises(RewardServerError, match=r"unreachable after 3 attempts; last error: HTTP 502: Bad Gateway"):
            client.score(["1+2="], ["3"], ["3"])
    assert len(received) == 3


def free_loopback_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_request_and_its_retries_end_at_the_deadline():
    """A server that accepts and never answers: each attempt would wait 5 s, four of them 20; the deadline ends
    the request after 1."""
    release = threading.Event()

    def hung(environ, start_response):
        release.wait()
        return protocol_only_app(environ, start_response)

    steps = watchdog.StepClock()
    try:
        with serving(hung) as url:
            client = RewardServerClient(url, timeout=5, max_retries=3, backoff=0.1,
                                        deadline=watchdog.Deadline(1.0, "a test's deadline", steps))
            start = time.perf_counter()
            with pytest.raises(RewardServerError, match=rf"{url} \(POST /\) answered nothing within a test's deadline=1 s, "
                                                        r"after \d+ RL steps; last error: ReadTimeout"):
                client.score([SRC], [TGT], [RIGHT])
            assert time.perf_counter() - start < 2
    finally:
        release.set()


def test_client_against_a_dead_port_fails_after_bounded_retries():
    url = f"http://127.0.0.1:{free_loopback_port()}"
    client = RewardServerClient(url, timeout=0.5, max_retries=2, backoff=0.05)
    start = time.perf_counter()
    with pytest.raises(
        RewardServerError, match=rf"{url} stayed unreachable after 3 attempts; last error: ConnectionError"
    ):
        client.score([SRC], [TGT], [RIGHT])
    assert time.perf_counter() - start < 5


class FakeAnswer:
    def __init__(self, status_code, body):
        self.status_code, self._body, self.text = status_code, body, json.dumps(body)

    def json(self):
        return self._body


@pytest.mark.parametrize(
    "body, words",
    [
        ({"error_code": 0, "error_msg": "Success", "score": [1.0]}, "returned 1 scores for 2 responses"),
        ({"error_code": 0, "error_msg": "Success", "score": [1.0, "high"]}, "non-numeric"),
        ({"error_code": 0, "error_msg": "Success", "score": [1.0, True]}, "non-numeric"),
        ({"error_code": 0, "error_msg": "Success"}, "returned NoneType scores"),
        ({"error_code": 7, "error_msg": "tokenizer missing", "score": []}, "error_code 7: tokenizer missing"),
        ({"error_code": 0, "error_msg": "Success", "score": [1.0, 1.0], "row_errors": [{"index": 2}]}, "row error naming no row"),
        ({"error_code": 0, "error_msg": "Success", "score": [1.0, 1.0], "score_parts": {"answer": [1.0]}}, "1 'answer' score parts for 2"),
        ({"error_code": 0, "error_msg": "Success", "score": [1.0, 1.0], "score_parts": [1.0]}, "score_parts that are not an object"),
        ([1.0, 2.0], "something other than a JSON object"),
    ],
)
def test_client_rejects_answers_it_cannot_trust(monkeypatch, body, words):
    client = RewardServerClient("http://127.0.0.1:1", timeout=1, max_retries=0)
    monkeypatch.setattr(client.session, "request", lambda *args, **kwargs: FakeAnswer(200, body))
    with pytest.raises(RewardServerError, match=words):
        client.score([SRC] * 2, [TGT] * 2, [RIGHT] * 2)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"url": "127.0.0.1:8731"}, "http://"),
        ({"url": "http://127.0.0.1:1", "timeout": 0}, "timeout"),
        ({"url": "http://127.0.0.1:1", "max_retries": -1}, "max_retries"),
        ({"url": "http://127.0.0.1:1", "backoff": -1}, "backoff"),
    ],
)
def test_client_rejects_bad_settings(kwargs, words):
    with pytest.raises(ValueError, match=words):
        RewardServerClient(**kwargs)


def test_create_app_rejects_unknown_task_and_bad_limits():
    with pytest.raises(ValueError, match="unknown reward task 'chess'"):
        create_app("chess")
    with pytest.raises(ValueError, match="max_batch"):
        create_app("kk", max_batch=0)


# ---------------------------------------------------------------- rules as served


def test_kk_server_scores_the_issue_parity_cases_as_paddlenlp_and_kk_strict_as_before():
    text_after_answer = RIGHT + "\nI hope this helps!"
    knight_not_a_knave = "Hm.</think>\n<answer>(1) Zoey is a knight, not a knave\n(2) Oliver is a knave</answer>"
    for task, expected in [("kk", [3.0, -1.0]), ("kk_strict", [-3.0, 3.0])]:
        with running_reward_server(task) as url:
            assert post(url, batch(text_after_answer, knight_not_a_knave)).json()["score"] == expected


GSM8K_TGT = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


def test_math_server_scores_gsm8k_and_math_golds_a_long_response_and_a_malformed_row_row_by_row():
    long_response = "Let me think. " * 22_000 + "\\boxed{\\frac{3}{4}}"  # 300 KB
    body = {
        "src": ["q"] * 6,
        "tgt": [GSM8K_TGT, "72", "\\frac{3}{4}", "\\frac{3}{4}", "the sum of the apples", "(3, \\frac{\\pi}{2})"],
        "response": ["#### 72", "so 72", "\\boxed{0.75}", long_response, "72", 5],
    }
    assert len(long_response) > 300_000
    with running_reward_server("math") as url:
        answer = post(url, body).json()
        assert requests.get(url + "/health", timeout=10).json()["min_score"] == 0.0
    assert answer["score"] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert [error["index"] for error in answer["row_errors"]] == [4, 5]
    assert "tgt='the sum of the apples'" in answer["row_errors"][0]["error_msg"]
    assert "response must be a string, got number" in answer["row_errors"][1]["error_msg"]


def test_a_hung_parse_ends_at_the_deadline_in_the_servers_threads_and_the_batch_is_answered():
    from paddle_alignment.rewards import symbolic

    tower = "\\boxed{10^{10^{10^{10^{10}}}}}"
    shared = symbolic.configure(deadline=1.0)
    try:
        with running_reward_server("math") as url:
            started = time.perf_counter()
            body = post(url, {"src": ["q"] * 2, "tgt": [SLOW_GOLD, "\\frac{3}{4}"], "response": [tower, "\\boxed{0.75}"]}).json()
            seconds = time.perf_counter() - started
    finally:
        symbolic.configure()
    assert body["score"] == [0.0, 1.0] and "row_errors" not in body
    assert shared.misses == 1 and seconds < 10  # the deadline, plus starting the workers


def test_math_think_answer_server_returns_the_answer_and_format_parts():
    exact = "<think>48 + 24 = 72</think>\n<answer>72</answer>"
    with running_reward_server("math_think_answer") as url:
        health = requests.get(url + "/health", timeout=10).json()
        body = post(url, {"src": ["q"] * 3, "tgt": ["72"] * 3, "response": [exact, "#### 72", "<think>x</think><answer>7</answer>"]}).json()
        scored = RewardServerClient(url, timeout=5).score(["q"], ["72"], [exact])
    assert health["parts"] == {"answer": [-1.0, 1.0], "format": [-1.0, 1.25]} and health["max_score"] == 2.25
    assert body["score_parts"] == {"answer": [1.0, 1.0, -1.0], "format": [1.25, -1.0, 1.25]}
    assert body["score"] == [2.25, 0.0, 0.25]
    assert scored.parts == {"answer": [1.0], "format": [1.25]}


# ---------------------------------------------------------------- authentication


@pytest.fixture(scope="module")
def key_server_url():
    with running_reward_server("kk", api_key="s3cret") as url:
        yield url


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}])
def test_server_with_api_key_refuses_requests_without_it(key_server_url, headers):
    answer = requests.post(key_server_url + "/", json=batch(RIGHT), headers=headers, timeout=10)
    assert_error(answer, 401, "missing or wrong API key", "Authorization: Bearer")
    assert_error(requests.get(key_server_url + "/health", headers=headers, timeout=10), 401)


def test_server_with_api_key_serves_requests_carrying_it(key_server_url):
    answer = requests.post(key_server_url + "/", json=batch(RIGHT), headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert answer.json() == {"error_code": 0, "error_msg": "Success", "score": [3.0]}


def test_trainer_client_sends_the_key_from_the_environment(key_server_url, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    args = SimpleNamespace(
        use_rule_reward=False, use_rm_server=True, uses_judge=False, reward_server=key_server_url, reward_server_timeout=30,
        reward_server_max_retries=0, reward_task="kk",
    )
    scorer = build_reward_scorer(args)
    assert scorer.max_score == 3.0
    exp = SimpleNamespace(prompts=[SRC], labels=[TGT], responses=[RIGHT])
    assert scorer.score(exp).scores == [3.0]
    with pytest.raises(RewardServerError, match="HTTP 401: missing or wrong API key"):
        RewardServerClient(key_server_url, timeout=5, api_key="wrong").score([SRC], [TGT], [RIGHT])


def test_create_app_rejects_an_empty_api_key():
    with pytest.raises(ValueError, match="api_key must not be empty"):
        create_app("kk", api_key="")


# ---------------------------------------------------------------- servers without /health (PaddleNLP's)


def test_scorer_without_health_takes_max_score_from_reward_task_and_with_health_checks_its_task(server_url):
    with serving(protocol_only_app) as url:
        client = RewardServerClient(url, timeout=5, max_retries=0)
        assert client.health() is None
        assert ServerRewardScorer(client, "arith").max_score == 1.0
        with pytest.raises(ValueError, match="unknown reward task 'chess'"):
            ServerRewardScorer(client, "chess")
    with pytest.raises(ValueError, match="scores task 'kk', but reward_task='arith'"):
        ServerRewardScorer(RewardServerClient(server_url, timeout=5), "arith")


def test_trainer_runs_two_steps_against_a_server_without_health(tiny_world, tmp_path):
    with serving(protocol_only_app) as url:
        argv = small_run_argv(
            tiny_world, str(tmp_path), max_steps=2, use_rm_server=True, use_rule_reward=False, reward_server=url, reward_task="arith"
        )
        run_ppo.main([TINY_CONFIG, *argv])
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2


# ---------------------------------------------------------------- the production WSGI server


def raw_post(url, body):
    """POST `body` on a fresh connection; (seconds to connect, HTTP status line, body)."""
    host, port = url.removeprefix("http://").split(":")
    start = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connected = time.perf_counter() - start
        data = json.dumps(body).encode()
        head = f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        connection.sendall(head.encode() + data)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return connected, head.split(b"\r\n")[0].decode(), json.loads(payload)


def test_three_hundred_concurrent_requests_connect_at_once_and_are_all_answered(server_url):
    barrier = threading.Barrier(300)

    def one_request(index):
        barrier.wait()
        return raw_post(server_url, batch(*[RIGHT, WRONG_ROLE][: index % 2 + 1]))

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=300) as pool:
        results = list(pool.map(one_request, range(300)))
    elapsed = time.perf_counter() - start
    connect_times = [connected for connected, _, _ in results]
    print(f"300 concurrent requests: {elapsed:.2f} s, slowest connect {max(connect_times) * 1000:.0f} ms")
    assert max(connect_times) < 1.0  # a full backlog would drop SYNs, retried after 1 s
    for index, (_, status, body) in enumerate(results):
        assert status == "HTTP/1.1 200 OK" and body["score"] == [3.0, -0.5][: index % 2 + 1]


def test_stalled_connections_hold_no_worker_and_are_closed_after_the_timeout():
    with serving_in_production(create_app("kk"), threads=2, connection_timeout=1) as url:
        host, port = url.removeprefix("http://").split(":")
        stalled = [socket.create_connection((host, int(port)), timeout=10) for _ in range(100)]
        for connection in stalled:  # headers promising a body that never comes
            connection.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        start = time.perf_counter()
        assert post(url, batch(RIGHT)).json()["score"] == [3.0]
        assert time.perf_counter() - start < 1.0
        start = time.perf_counter()
        for connection in stalled:
            with connection:
                assert connection.recv(1024) == b""  # closed by the server, not by our timeout
        assert time.perf_counter() - start < 5.0


# ---------------------------------------------------------------- slow answers, shutdown

TOWER = "\\boxed{9^{9^{9^{9}}}}"  # SymPy evaluates the integer: each comparison runs to the symbolic deadline
SLOW_GOLD = "\\sqrt{2}"  # a reference that is no plain number, so a tower is compared symbolically


def test_sixteen_power_towers_and_ordinary_rows_are_answered_within_the_grading_budget():
    """At the defaults (2-4 symbolic workers, 5 s per comparison, a 20 s budget): graded one after another the
    towers would take 80 s, past the trainer's 60 s timeout."""
    from paddle_alignment.rewards import DEFAULT_GRADING_BUDGET, symbolic

    symbolic.configure()
    body = {
        "src": ["q"] * 19,
        "tgt": [SLOW_GOLD] * 16 + ["5", "\\frac{3}{4}", "12"],
        "response": [TOWER] * 16 + ["\\boxed{5}", "The answer is 0.75.", "#### 13"],
    }
    with running_reward_server("math") as url:
        started = time.perf_counter()
        answer = requests.post(url + "/", json=body, timeout=60).json()
        seconds = time.perf_counter() - started
    assert seconds < 30 and DEFAULT_GRADING_BUDGET <= seconds
    assert answer["score"] == [0.0] * 16 + [1.0, 1.0, 0.0]
    late = answer["row_errors"]
    assert late and all(error["index"] < 16 and "grading budget of 20 s" in error["error_msg"] for error in late)


def test_a_power_tower_against_a_number_is_graded_wrong_without_a_symbolic_comparison():
    from paddle_alignment.rewards import symbolic

    shared = symbolic.configure()
    started = time.perf_counter()
    batch = REWARD_TASKS["math"].score_batch(["q"] * 3, ["81", "1024", "5"], [TOWER, "\\boxed{2^{10}}", "\\boxed{10^{10^{10^{10^{10}}}}}"])
    assert batch.scores == [0.0, 1.0, 0.0] and not batch.errors and shared.misses == 0
    assert time.perf_counter() - started < 5  # 2^{10} goes to the workers (one starts); the towers do not


def test_a_client_whose_timeout_the_grading_budget_would_outlast_is_refused_at_start():
    with running_reward_server("math", grading_budget=30) as url:
        with pytest.raises(ValueError, match=r"reward_server_timeout=35 s is shorter than .*\(30 s, its --grading_budget\) plus 10 s"):
            ServerRewardScorer(RewardServerClient(url, timeout=35), "math")
        assert ServerRewardScorer(RewardServerClient(url, timeout=40), "math").max_score == 1.0
    with pytest.raises(ValueError, match="grading_budget must be > 0"):
        create_app("math", grading_budget=0)


def group_processes(group):
    """The live (not zombie) processes of process group `group`."""
    alive = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(int(entry))
    return alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_signal_mid_comparison_ends_the_server_and_every_worker(signum):
    """SIGTERM and SIGINT stop the server gracefully, ending its workers; after a SIGKILL they end themselves."""
    port = free_loopback_port()
    server = subprocess.Popen(
        [sys.executable, os.path.join(REPO_ROOT, "llm", "alignment", "ppo", "reward_server.py"), "--task", "math",
         "--port", str(port), "--grading_deadline", "120", "--grading_budget", "200"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                requests.get(url + "/health", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        threading.Thread(target=post_ignoring_errors, args=(url, {"src": ["q"], "tgt": [SLOW_GOLD], "response": [TOWER]}), daemon=True).start()
        for _ in range(300):  # the symbolic worker started and took the tower
            if len(group_processes(server.pid)) > 1:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        assert len(group_processes(server.pid)) > 1
        server.send_signal(signum)
        assert server.wait(timeout=10) == (-signum if signum == signal.SIGKILL else 0)
        for _ in range(50):
            if not group_processes(server.pid):
                break
            time.sleep(0.1)
        assert group_processes(server.pid) == []
    finally:
        if group_processes(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)


def post_ignoring_errors(url, body):
    try:
        requests.post(url + "/", json=body, timeout=60)
    except requests.RequestException:
        pass
