"""Reward server scoring responses with a rule reward from `rewards/` (PaddleNLP-compatible protocol).

    python llm/alignment/ppo/reward_server.py --task kk --host 127.0.0.1 --port 8731

POST /        {"src": [str], "tgt": [str], "response": [str]}
              -> 200 {"error_code": 0, "error_msg": "Success", "score": [float]}
GET  /health  -> 200 {"status": "ok", "task": str, "max_score": float}   (optional for clients: PaddleNLP's has none)
Any failure   -> 4xx/5xx {"error_code": <the HTTP status>, "error_msg": str, "score": []}

A bad request (malformed or too deeply nested JSON, missing keys, wrong types, unequal lengths, a tgt the
task's rule cannot read) gets 400, too many items, bytes or characters in one item 413, a missing or
wrong API key 401. An item the rule cannot score otherwise (it raises, or gives a non-finite score) gets
422. Errors about an item name the task, the item's index and its src/tgt/response (each cut to 200 chars):
    reward 'arith' cannot score item 3 (src='4+2=', tgt='abc', response='12'): TargetError: ...
An unexpected error in the server gets 500. Every answer of this protocol is final for its request:
clients retry only outages, such as a proxy's 502/503/504 with a body that is not of this protocol.

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

import waitress  # noqa: E402
from flask import Flask, jsonify, request  # noqa: E402
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge  # noqa: E402

from paddle_alignment.rewards import API_KEY_ENV, REWARD_TASKS, RewardInputError, get_reward_task  # noqa: E402

logger = logging.getLogger(__name__)

REQUEST_KEYS = ("src", "tgt", "response")
DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_CONTENT_LENGTH = 64 * 1024 * 1024
# Far above a response of 32k tokens; rules are linear, so this bounds one item's scoring time.
DEFAULT_MAX_ITEM_CHARS = 256 * 1024
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


class RequestError(Exception):
    """A request the server answers with `status` and a message naming the problem."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def reply(status, message, scores=()):
    body = {"error_code": 0 if status == 200 else status, "error_msg": message, "score": list(scores)}
    return jsonify(body), status


def json_type(value):
    return JSON_TYPE_NAMES.get(type(value), "null")


def parse_batch(raw_body, max_batch, max_item_chars):
    """The src, tgt and response lists of a request body, checked."""
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
        column = body[key]
        if not isinstance(column, list):
            raise RequestError(400, f"{key!r} must be a list of strings, got {json_type(column)}")
        for index, item in enumerate(column):
            if not isinstance(item, str):
                raise RequestError(400, f"{key}[{index}] must be a string, got {json_type(item)}")
            if len(item) > max_item_chars:
                raise RequestError(413, f"{key}[{index}] has {len(item)} characters, over max_item_chars={max_item_chars}")
        columns.append(column)
    lengths = [len(column) for column in columns]
    if len(set(lengths)) > 1:
        sizes = ", ".join(f"{key}={length}" for key, length in zip(REQUEST_KEYS, lengths))
        raise RequestError(400, f"src, tgt and response must have the same length, got {sizes}")
    if lengths[0] > max_batch:
        raise RequestError(413, f"batch of {lengths[0]} items exceeds max_batch={max_batch}")
    return columns


def create_app(
    task_name,
    max_batch=DEFAULT_MAX_BATCH,
    max_content_length=DEFAULT_MAX_CONTENT_LENGTH,
    max_item_chars=DEFAULT_MAX_ITEM_CHARS,
    api_key=None,
):
    """A Flask app scoring with the registered reward `task_name`; with `api_key`, only for requests carrying it."""
    task = get_reward_task(task_name)
    for name, value in (("max_batch", max_batch), ("max_content_length", max_content_length), ("max_item_chars", max_item_chars)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
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
        src, tgt, response = parse_batch(raw_body, max_batch, max_item_chars)
        try:
            scores = task.score_batch(src, tgt, response)
        except RewardInputError as error:
            logger.exception("%s", error)
            # 4xx, not 500: the data cannot be scored, so a client must not retry it as an outage.
            raise RequestError(400 if error.unreadable_target else 422, str(error)) from error
        return reply(200, "Success", scores)

    @app.get("/health")
    def health():
        return jsonify(status="ok", task=task.name, max_score=task.max_score)

    @app.errorhandler(RequestError)
    def request_error(error):
        return reply(error.status, str(error))

    @app.errorhandler(RequestEntityTooLarge)
    def body_too_large(error):
        return reply(error.code, f"request body exceeds max_content_length={max_content_length} bytes")

    @app.errorhandler(HTTPException)
    def http_error(error):
        return reply(error.code, f"{error.name}: {request.method} {request.path}")

    @app.errorhandler(Exception)
    def unexpected_error(error):
        logger.exception("unexpected error serving %s %s", request.method, request.path)
        return reply(500, f"internal error: {type(error).__name__}: {error}")

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
    parser.add_argument("--max_item_chars", type=int, default=DEFAULT_MAX_ITEM_CHARS, help="most characters in one src/tgt/response")
    parser.add_argument(
        "--api_key", default=os.environ.get(API_KEY_ENV), help=f"shared secret clients must send (default: ${API_KEY_ENV})"
    )
    parser.add_argument("--threads", type=int, default=8, help="worker threads scoring requests")
    parser.add_argument("--connection_timeout", type=int, default=60, help="seconds before an idle connection is closed")
    parser.add_argument("--backlog", type=int, default=2048, help="connections the OS queues before accepting")
    parser.add_argument("--max_connections", type=int, default=1000, help="open connections served at once")
    args = parser.parse_args(argv)
    for name in ("threads", "connection_timeout", "backlog", "max_connections"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        app = create_app(args.task, args.max_batch, args.max_content_length, args.max_item_chars, args.api_key)
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.api_key is None and args.host not in LOOPBACK_HOSTS:
        logger.warning("serving on %s without --api_key: anyone who reaches this port can use it", args.host)
    server = create_wsgi_server(
        app, args.host, args.port, args.threads, args.connection_timeout, args.backlog, args.max_connections
    )
    logger.info("reward task %r served on http://%s:%s", args.task, args.host, args.port)
    server.run()


if __name__ == "__main__":
    main()
