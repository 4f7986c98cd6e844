"""Flask server scoring responses with a rule reward from `rewards/` (PaddleNLP-compatible protocol).

    python llm/alignment/ppo/reward_server.py --task kk --host 127.0.0.1 --port 8731

POST /        {"src": [str], "tgt": [str], "response": [str]}
              -> 200 {"error_code": 0, "error_msg": "Success", "score": [float]}
GET  /health  -> 200 {"status": "ok", "task": str, "max_score": float}
Any failure   -> 4xx/5xx {"error_code": <the HTTP status>, "error_msg": str, "score": []}

A bad request (malformed JSON, missing keys, wrong types, unequal lengths) gets 400, too many items or
bytes 413. An item the reward cannot score (its rule raises, or gives a non-finite score) gets 422,
with an error_msg naming the task, the item's index and its src/tgt/response (each cut to 200 chars):
    reward 'arith' cannot score item 3 (src='1+2=', tgt='abc', response='12'): ValueError: ...
An unexpected error in the server gets 500. Every answer of this protocol is final for its request:
clients retry only outages, such as a proxy's 502/503/504 with a body that is not of this protocol.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

if not __package__:
    # Run as a script path: make the `llm` package importable from the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from flask import Flask, jsonify, request  # noqa: E402
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge  # noqa: E402

from llm.alignment.ppo.rewards import REWARD_TASKS, RewardInputError, get_reward_task  # noqa: E402

logger = logging.getLogger(__name__)

REQUEST_KEYS = ("src", "tgt", "response")
DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_CONTENT_LENGTH = 64 * 1024 * 1024
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


def parse_batch(raw_body, max_batch):
    """The src, tgt and response lists of a request body, checked."""
    try:
        body = json.loads(raw_body)
    except ValueError as error:  # also bodies that are not UTF-8
        raise RequestError(400, f"request body is not valid JSON: {error}") from None
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
        columns.append(column)
    lengths = [len(column) for column in columns]
    if len(set(lengths)) > 1:
        sizes = ", ".join(f"{key}={length}" for key, length in zip(REQUEST_KEYS, lengths))
        raise RequestError(400, f"src, tgt and response must have the same length, got {sizes}")
    if lengths[0] > max_batch:
        raise RequestError(413, f"batch of {lengths[0]} items exceeds max_batch={max_batch}")
    return columns


def create_app(task_name, max_batch=DEFAULT_MAX_BATCH, max_content_length=DEFAULT_MAX_CONTENT_LENGTH):
    """A Flask app scoring with the registered reward `task_name`."""
    task = get_reward_task(task_name)
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    if max_content_length < 1:
        raise ValueError(f"max_content_length must be >= 1, got {max_content_length}")
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_content_length

    @app.post("/")
    def score():
        raw_body = request.get_data(cache=False)
        if len(raw_body) == max_content_length:
            # A chunked body is cut at the limit, not refused: reading past it raises the 413.
            request.stream.read(1)
        src, tgt, response = parse_batch(raw_body, max_batch)
        try:
            scores = task.score_batch(src, tgt, response)
        except RewardInputError as error:
            logger.exception("%s", error)
            # 422, not 500: the data cannot be scored, so a client must not retry it as an outage.
            raise RequestError(422, str(error)) from error
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(REWARD_TASKS), help="registered reward task")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8731)
    parser.add_argument("--max_batch", type=int, default=DEFAULT_MAX_BATCH, help="most items in one request")
    parser.add_argument("--max_content_length", type=int, default=DEFAULT_MAX_CONTENT_LENGTH, help="bytes")
    args = parser.parse_args(argv)
    try:
        app = create_app(args.task, args.max_batch, args.max_content_length)
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app.run(host=args.host, port=args.port, threaded=True)


if __name__ == "__main__":
    main()
