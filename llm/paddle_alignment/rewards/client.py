"""Client of the reward server, as the trainer uses it.

Only what may be an outage is retried, with exponential backoff and a warning per retry: connection
errors, timeouts, and 5xx answers that are not of the protocol (a proxy's 502/503/504, say). An answer
of the protocol with a non-zero error_code is the server's verdict on the data (a 4xx, the 422 naming
an item it cannot score, a 500 of its own): it raises `RewardServerError` at once with the server's
message, since asking again would get the same answer. It never returns made-up scores: training on
rewards that were never computed would be silently wrong.

With an API key (the `api_key` argument, else the REWARD_SERVER_API_KEY environment variable) every
request carries `Authorization: Bearer <key>`, as the reward server started with `--api_key` requires.
"""

import math
import os
import time

import requests
from paddlenlp.utils.log import logger

from paddle_alignment.rewards import API_KEY_ENV


class RewardServerError(RuntimeError):
    """The reward server refused a request (`status_code` its HTTP status), answered nonsense, or stayed unreachable."""

    def __init__(self, message, status_code=None):
        super().__init__(message)
        self.status_code = status_code


class RetryableError(Exception):
    """A failure worth another attempt: the server, or a proxy in front of it, may be restarting or overloaded."""


class RewardServerClient:
    def __init__(self, url, timeout=30.0, max_retries=3, backoff=1.0, api_key=None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward server url must start with http:// or https://, got {url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff < 0:
            raise ValueError(f"backoff must be >= 0 seconds, got {backoff}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
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
        """One float per response, in order."""
        batch = {"src": list(src), "tgt": list(tgt), "response": list(response)}
        body = self._request("POST", "/", json=batch)
        scores, expected = body.get("score"), len(batch["response"])
        if not isinstance(scores, list) or len(scores) != expected:
            count = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise RewardServerError(f"reward server at {self.url} returned {count} scores for {expected} responses")
        if not all(is_real_number(score) for score in scores):
            raise RewardServerError(f"reward server at {self.url} returned non-numeric scores: {scores[:8]}")
        return [float(score) for score in scores]

    def _request(self, method, path, **kwargs):
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return self._request_once(method, path, **kwargs)
            except RetryableError as error:
                last_error = error
            if attempt < attempts:
                wait = self.backoff * 2 ** (attempt - 1)
                logger.warning(
                    f"reward server at {self.url} ({method} {path}): attempt {attempt}/{attempts} failed "
                    f"({last_error}); retrying in {wait:g}s"
                )
                time.sleep(wait)
        raise RewardServerError(
            f"reward server at {self.url} stayed unreachable after {attempts} attempts; last error: {last_error}"
        )

    def _request_once(self, method, path, **kwargs):
        try:
            answer = self.session.request(method, self.url + path, timeout=self.timeout, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as error:
            raise RetryableError(f"{type(error).__name__}: {error}") from error
        body = json_object_or_none(answer)
        message = body.get("error_msg") if body is not None else None
        if not isinstance(message, str):
            message = answer.text[:300]
        if answer.status_code >= 500 and not is_protocol_error(body):
            raise RetryableError(f"HTTP {answer.status_code}: {message}")
        where = f"reward server at {self.url} ({method} {path})"
        if answer.status_code >= 400:
            raise RewardServerError(
                f"{where} rejected the request with HTTP {answer.status_code}: {message}", answer.status_code
            )
        if body is None:
            raise RewardServerError(f"{where} answered with something other than a JSON object: {message}")
        if body.get("error_code", 0) != 0:
            raise RewardServerError(f"{where} reported error_code {body['error_code']}: {message}")
        return body


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
