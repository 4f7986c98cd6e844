"""Client of the reward server, as the trainer uses it.

Only what may be an outage is retried, with exponential backoff and a warning per retry: connection
errors, timeouts, and 5xx answers that are not of the protocol (a proxy's 502/503/504, say). An answer
of the protocol with a non-zero error_code is the server's verdict on the whole request (a 4xx, a 500
of its own): it raises `RewardServerError` at once with the server's
message, since asking again would get the same answer. It never returns made-up scores: training on
rewards that were never computed would be silently wrong.

Rows the server could not score (`row_errors`: a row's tgt it cannot read, a rule failing on one row)
come back scored at the task's min_score; `score` returns them in the ScoredBatch's `errors`, and the
trainer logs each with the server's message and counts them (`reward_error_rows`), but goes on: one bad
row does not stop a run. Score parts (`score_parts`, such as the GSM8K recipe's answer and format
rewards) come back in the ScoredBatch's `parts`.

With a `deadline` (watchdog.Deadline: the trainer's, derived from its RL steps) a request and its retries
end within it, so a server that accepts and never answers stops the run with an error naming the server,
the step and the last error, instead of holding it for every attempt's full `timeout`.

With an API key (the `api_key` argument, else the REWARD_SERVER_API_KEY environment variable) every
request carries `Authorization: Bearer <key>`, as the reward server started with `--api_key` requires.
"""

import math
import os
import time

import requests
from paddlenlp.utils.log import logger

from paddle_alignment import watchdog
from paddle_alignment.rewards import API_KEY_ENV, ScoredBatch


class RewardServerError(RuntimeError):
    """The reward server refused a request (`status_code` its HTTP status), answered nonsense, or stayed unreachable."""

    def __init__(self, message, status_code=None):
        super().__init__(message)
        self.status_code = status_code


class RetryableError(Exception):
    """A failure worth another attempt: the server, or a proxy in front of it, may be restarting or overloaded."""


class RewardServerClient:
    def __init__(self, url, timeout=30.0, max_retries=3, backoff=1.0, api_key=None, deadline=None, name="reward server"):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward server url must start with http:// or https://, got {url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff < 0:
            raise ValueError(f"backoff must be >= 0 seconds, got {backoff}")
        self.url, self.name = url.rstrip("/"), name  # the name errors give it: "reward server", "judge server"
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.deadline = deadline
        self.session = requests.Session()
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def health(self):
        """The server's `{"status", "task", "max_score"}`, or None from a server without GET /health (PaddleNLP's)."""
        try:
            return self._request("GET", "/health")
        except RewardServerError as error:
            if error.status_code in (404, 405):
                return None
            raise

    def score(self, src, tgt, response):
        """A ScoredBatch: one float per response, in order, with the server's score parts and row errors."""
        batch = {"src": list(src), "tgt": list(tgt), "response": list(response)}
        body = self._request("POST", "/", json=batch)
        expected = len(batch["response"])
        scores = self.numbers(body.get("score"), expected, "scores")
        parts = body.get("score_parts") or {}
        if not isinstance(parts, dict):
            raise RewardServerError(f"{self.name} at {self.url} returned score_parts that are not an object: {parts!r:.200}")
        parts = {str(name): self.numbers(values, expected, f"{name!r} score parts") for name, values in parts.items()}
        return ScoredBatch(scores, parts, self.row_errors(body.get("row_errors") or [], expected))

    def numbers(self, values, expected, what):
        if not isinstance(values, list) or len(values) != expected:
            count = len(values) if isinstance(values, list) else type(values).__name__
            raise RewardServerError(f"{self.name} at {self.url} returned {count} {what} for {expected} responses")
        if not all(is_real_number(value) for value in values):
            raise RewardServerError(f"{self.name} at {self.url} returned non-numeric {what}: {values[:8]}")
        return [float(value) for value in values]

    def row_errors(self, entries, expected):
        errors = []
        for entry in entries:
            index = entry.get("index") if isinstance(entry, dict) else None
            if not (isinstance(index, int) and 0 <= index < expected):
                raise RewardServerError(f"{self.name} at {self.url} returned a row error naming no row of the batch: {entry!r:.200}")
            errors.append((index, str(entry.get("error_msg", ""))))
        return errors

    def _request(self, method, path, **kwargs):
        attempts = self.max_retries + 1
        give_up = None if self.deadline is None else time.monotonic() + self.deadline.seconds()
        def left():
            return math.inf if give_up is None else max(give_up - time.monotonic(), 0.0)

        for attempt in range(1, attempts + 1):
            try:
                return self._request_once(method, path, min(self.timeout, max(left(), 1e-3)), **kwargs)
            except RetryableError as error:
                last_error = error
            if left() == 0:
                raise RewardServerError(
                    f"{self.name} at {self.url} ({method} {path}) answered nothing within {self.deadline.describe()}, "
                    f"after {watchdog.STEPS.done} RL steps; last error: {last_error}. Resume from the last checkpoint "
                    "by running the same command again"
                )
            if attempt < attempts:
                wait = min(self.backoff * 2 ** (attempt - 1), left())
                logger.warning(
                    f"{self.name} at {self.url} ({method} {path}): attempt {attempt}/{attempts} failed "
                    f"({last_error}); retrying in {wait:g}s"
                )
                time.sleep(wait)
        raise RewardServerError(
            f"{self.name} at {self.url} stayed unreachable after {attempts} attempts; last error: {last_error}"
        )

    def _request_once(self, method, path, timeout, **kwargs):
        try:
            answer = self.session.request(method, self.url + path, timeout=timeout, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as error:
            raise RetryableError(f"{type(error).__name__}: {error}") from error
        body = json_object_or_none(answer)
        message = body.get("error_msg") if body is not None else None
        if not isinstance(message, str):
            message = answer.text[:300]
        if answer.status_code >= 500 and not is_protocol_error(body):
            raise RetryableError(f"HTTP {answer.status_code}: {message}")
        where = f"{self.name} at {self.url} ({method} {path})"
        if answer.status_code >= 400:
            raise RewardServerError(
                f"{where} rejected the request with HTTP {answer.status_code}: {message}", answer.status_code
            )
        if body is None:
            raise RewardServerError(f"{where} answered with something other than a JSON object: {message}")
        if body.get("error_code", 0) != 0:
            raise RewardServerError(f"{where} reported error_code {body['error_code']}: {message}")
        return body


def server_client(args, url, name="reward server"):
    """A client of the reward-server protocol at `url` with the config's timeout, retries and the run's deadline;
    `name` ("reward server", "judge server") is what its errors call it."""
    return RewardServerClient(url, timeout=args.reward_server_timeout, max_retries=args.reward_server_max_retries,
                              deadline=watchdog.Deadline(), name=name)


def json_object_or_none(answer):
    try:
        body = answer.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def is_protocol_error(body):
    """Whether `body` is the server's own error answer, as opposed to a proxy's or a crash page."""
    return body is not None and body.get("error_code") not in (None, 0) and isinstance(body.get("error_msg"), str)


def is_real_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
