"""Reward server scoring responses with a rule reward from `rewards/` (PaddleNLP-compatible protocol).

    python llm/alignment/ppo/reward_server.py --task math --host 127.0.0.1 --port 8731

POST /        {"src": [str], "tgt": [str], "response": [str]}
              -> 200 {"error_code": 0, "error_msg": "Success", "score": [float]}
                 + "row_errors": [{"index": int, "error_msg": str}]   when rows could not be scored
                 + "score_parts": {name: [float]}                     for a task with parts (math_think_answer)
GET  /health  -> 200 {"status": "ok", "task": str, "max_score": float, "min_score": float, "parts": {name: [min, max]},
                      "grading_budget": float}   (optional for clients: PaddleNLP's has none)
A refused request -> 4xx/5xx {"error_code": <the HTTP status>, "error_msg": str, "score": []}

One bad row never fails the batch: a row whose src/tgt/response is not a string, whose src or tgt is over
`--max_item_chars`, whose tgt the task's rule cannot read, or that the rule fails on gets the task's
min_score and an entry in row_errors naming the task, the row and its values (each cut to 200 chars):
    reward 'math' cannot score item 3 (src='...', tgt='the sum of the apples', response='72'): TargetError: ...
Responses of any length are scored (the math rules read the last 4,000 characters). Only a request the
protocol cannot answer row by row is refused: a body that is not a JSON object of three equal-length
lists (400), over `--max_batch` rows or `--max_content_length` bytes (413), a missing or wrong API key
(401); an unexpected error in the server gets 500. Every answer of this protocol is final for its
request: clients retry only outages, such as a proxy's 502/503/504 with a body that is not of this protocol.

A request's rows are graded concurrently, all within `--grading_budget` seconds: a row still being graded then
gets min_score and a row error saying so, so a batch of slow answers is answered in time. The math rules
compare symbolic answers in `--grading_workers` worker processes, each comparison ended at
`--grading_deadline` seconds (then graded wrong, with a warning that counts them). SIGTERM and SIGINT end the
server and its workers, a comparison in progress included.

It serves with waitress, a production WSGI server: connections idle for `--connection_timeout` seconds
are closed (a stalled client holds no worker thread meanwhile), and the listen backlog and connection
limit take hundreds of concurrent trainer ranks. With `--api_key` (or the REWARD_SERVER_API_KEY
environment variable) every request must carry `Authorization: Bearer <key>`, as the trainer's client
sends when that variable is set.
"""

import argparse
import hmac
import json
import logging
import os
import signal
import sys

import waitress  # noqa: E402
from flask import Flask, jsonify, request  # noqa: E402
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge  # noqa: E402

from paddle_alignment.rewards import (  # noqa: E402
    API_KEY_ENV,
    DEFAULT_GRADING_BUDGET,
    REWARD_TASKS,
    describe_item,
    get_reward_task,
)
from paddle_alignment.rewards import symbolic  # noqa: E402

logger = logging.getLogger(__name__)

REQUEST_KEYS = ("src", "tgt", "response")
DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_CONTENT_LENGTH = 64 * 1024 * 1024
# Far above a prompt of 32k tokens.
DEFAULT_MAX_ITEM_CHARS = 256 * 1024
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


class RequestError(Exception):
    """A request the server answers with `status` and a message naming the problem."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def refusal(status, message):
    return jsonify({"error_code": status, "error_msg": message, "score": []}), status


def json_type(value):
    return JSON_TYPE_NAMES.get(type(value), "null")


def parse_batch(raw_body, max_batch):
    """The src, tgt and response lists of a request body, as sent (items may be of any JSON type)."""
    try:
        body = json.loads(raw_body)
    except ValueError as error:  # also bodies that are not UTF-8
        raise RequestError(400, f"request body is not valid JSON: {error}") from None
    except RecursionError:
        raise RequestError(400, "request body is JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError(
            400, f"request body must be a JSON object with keys {list(REQUEST_KEYS)}, got {json_type(body)}"
        )
    columns = []
    for key in REQUEST_KEYS:
        if key not in body:
            raise RequestError(400, f"request body lacks key {key!r}")
        if not isinstance(body[key], list):
            raise RequestError(400, f"{key!r} must be a list of strings, got {json_type(body[key])}")
        columns.append(body[key])
    lengths = [len(column) for column in columns]
    if len(set(lengths)) > 1:
        sizes = ", ".join(f"{key}={length}" for key, length in zip(REQUEST_KEYS, lengths))
        raise RequestError(400, f"src, tgt and response must have the same length, got {sizes}")
    if lengths[0] > max_batch:
        raise RequestError(413, f"batch of {lengths[0]} items exceeds max_batch={max_batch}")
    return columns


def malformed_row(task, index, row, max_item_chars):
    """Why the row (src, tgt, response) cannot be given to the rule, or None when it can."""
    for key, item in zip(REQUEST_KEYS, row):
        if not isinstance(item, str):
            return f"reward {task.name!r} cannot score item {index}: {key} must be a string, got {json_type(item)}"
    for key, item in zip(REQUEST_KEYS[:2], row):
        if len(item) > max_item_chars:
            return (
                f"reward {task.name!r} cannot score {describe_item(index, *row)}: "
                f"{key} has {len(item)} characters, over max_item_chars={max_item_chars}"
            )
    return None


def score_rows(task, src, tgt, response, max_item_chars, grading_budget):
    """The reply's body for a parsed batch: every row scored, the malformed ones and those not graded within
    `grading_budget` seconds at min_score."""
    rows = list(zip(src, tgt, response))
    problems = {index: malformed_row(task, index, row, max_item_chars) for index, row in enumerate(rows)}
    problems = {index: why for index, why in problems.items() if why}
    scored = task.score_batch(src, tgt, response, problems, grading_budget)
    body = {"error_code": 0, "error_msg": "Success", "score": scored.scores}
    if scored.errors:
        body["error_msg"] = f"{len(scored.errors)} of {len(rows)} rows could not be scored and got min_score {task.min_score:g}"
        body["row_errors"] = [{"index": index, "error_msg": message} for index, message in scored.errors]
        for _, message in scored.errors:
            logger.warning("%s", message)
    if scored.parts:
        body["score_parts"] = scored.parts
    return body


def create_app(
    task_name,
    max_batch=DEFAULT_MAX_BATCH,
    max_content_length=DEFAULT_MAX_CONTENT_LENGTH,
    max_item_chars=DEFAULT_MAX_ITEM_CHARS,
    api_key=None,
    grading_budget=DEFAULT_GRADING_BUDGET,
):
    """A Flask app scoring with the registered reward `task_name`, each request's rows within `grading_budget`
    seconds; with `api_key`, only for requests carrying it."""
    task = get_reward_task(task_name)
    for name, value in (("max_batch", max_batch), ("max_content_length", max_content_length), ("max_item_chars", max_item_chars)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not grading_budget > 0:
        raise ValueError(f"grading_budget must be > 0 seconds, got {grading_budget}")
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty; leave it unset to serve without authentication")
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_content_length

    if api_key is not None:
        expected_header = f"Bearer {api_key}".encode()

        @app.before_request
        def authenticate():
            sent = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(sent, expected_header):
                raise RequestError(401, "missing or wrong API key: send the header 'Authorization: Bearer <api_key>'")

    @app.post("/")
    def score():
        raw_body = request.get_data(cache=False)
        if len(raw_body) == max_content_length:
            # A chunked body is cut at the limit, not refused: reading past it raises the 413.
            request.stream.read(1)
        src, tgt, response = parse_batch(raw_body, max_batch)
        return jsonify(score_rows(task, src, tgt, response, max_item_chars, grading_budget)), 200

    @app.get("/health")
    def health():
        parts = {name: list(bounds) for name, bounds in task.parts.items()}
        return jsonify(
            status="ok", task=task.name, max_score=task.max_score, min_score=task.min_score, parts=parts,
            grading_budget=grading_budget,
        )

    @app.errorhandler(RequestError)
    def request_error(error):
        return refusal(error.status, str(error))

    @app.errorhandler(RequestEntityTooLarge)
    def body_too_large(error):
        return refusal(error.code, f"request body exceeds max_content_length={max_content_length} bytes")

    @app.errorhandler(HTTPException)
    def http_error(error):
        return refusal(error.code, f"{error.name}: {request.method} {request.path}")

    @app.errorhandler(Exception)
    def unexpected_error(error):
        logger.exception("unexpected error serving %s %s", request.method, request.path)
        return refusal(500, f"internal error: {type(error).__name__}: {error}")

    return app


def create_wsgi_server(app, host, port, threads=8, connection_timeout=60, backlog=2048, max_connections=1000):
    """A waitress server for `app` (not yet running: call `.run()`); port 0 picks a free one (`.effective_port`)."""
    return waitress.create_server(
        app,
        host=host,
        port=port,
        threads=threads,
        channel_timeout=connection_timeout,
        # Idle connections are looked for this often, so a stalled one closes within twice the timeout.
        cleanup_interval=max(1, min(30, connection_timeout)),
        backlog=backlog,
        connection_limit=max_connections,
        asyncore_use_poll=True,  # select() fails past 1024 open sockets
        clear_untrusted_proxy_headers=True,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(REWARD_TASKS), help="registered reward task")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8731)
    parser.add_argument("--max_batch", type=int, default=DEFAULT_MAX_BATCH, help="most items in one request")
    parser.add_argument("--max_content_length", type=int, default=DEFAULT_MAX_CONTENT_LENGTH, help="bytes")
    parser.add_argument(
        "--max_item_chars", type=int, default=DEFAULT_MAX_ITEM_CHARS, help="most characters of one src or tgt (a longer one is a row error)"
    )
    parser.add_argument(
        "--api_key", default=os.environ.get(API_KEY_ENV), help=f"shared secret clients must send (default: ${API_KEY_ENV})"
    )
    parser.add_argument("--threads", type=int, default=8, help="worker threads scoring requests")
    parser.add_argument(
        "--grading_workers", type=int, default=symbolic.DEFAULT_WORKERS, help="worker processes comparing symbolic math answers"
    )
    parser.add_argument(
        "--grading_deadline", type=float, default=symbolic.DEFAULT_DEADLINE,
        help="seconds one symbolic comparison may take before it is graded wrong (with a counted warning)",
    )
    parser.add_argument(
        "--grading_budget", type=float, default=DEFAULT_GRADING_BUDGET,
        help="seconds all rows of one request may take together; rows still being graded then get min_score and a "
        "row error (the trainer's reward_server_timeout must be at least 10 s longer)",
    )
    parser.add_argument("--connection_timeout", type=int, default=60, help="seconds before an idle connection is closed")
    parser.add_argument("--backlog", type=int, default=2048, help="connections the OS queues before accepting")
    parser.add_argument("--max_connections", type=int, default=1000, help="open connections served at once")
    args = parser.parse_args(argv)
    for name in ("threads", "connection_timeout", "backlog", "max_connections"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        symbolic.configure(args.grading_workers, args.grading_deadline)
        app = create_app(
            args.task, args.max_batch, args.max_content_length, args.max_item_chars, args.api_key, args.grading_budget
        )
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.api_key is None and args.host not in LOOPBACK_HOSTS:
        logger.warning("serving on %s without --api_key: anyone who reaches this port can use it", args.host)
    server = create_wsgi_server(
        app, args.host, args.port, args.threads, args.connection_timeout, args.backlog, args.max_connections
    )
    logger.info("reward task %r served on http://%s:%s", args.task, args.host, args.port)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        server.run()
    finally:
        symbolic.symbolic_math().close()  # its workers, busy ones included


def stop(signum, frame):
    """SIGTERM or SIGINT: leave server.run() (which takes it as a graceful stop: exit status 0), whose caller
    then ends the grading workers."""
    logger.info("reward server stopping on %s", signal.Signals(signum).name)
    sys.exit(0)


if __name__ == "__main__":
    main()
