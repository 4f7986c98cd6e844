"""Symbolic math (math-verify's LaTeX-to-SymPy parsing and comparison) in worker processes, with a deadline.

A parse can run for minutes on some inputs (`10^{10^{10}}`), and math-verify's own timeout is a SIGALRM,
which only works in a process's main thread: the reward server scores in worker threads. So each call goes
to a worker process (`rewards/symbolic_worker.py`, through deadline_workers.py), and a call that passes the
deadline counts as a miss (`None`), with a warning that says how many there have been.
"""

import atexit
import logging
import os
import threading

from paddle_alignment.deadline_workers import DeadlineExceeded, WorkerPool

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE = 5.0  # seconds per call, as math-verify's own default timeout
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)


class SymbolicMath:
    """Up to `workers` worker processes shared by the calling threads, each call ended after `deadline` s."""

    def __init__(self, workers=DEFAULT_WORKERS, deadline=DEFAULT_DEADLINE):
        self.pool = WorkerPool("paddle_alignment.rewards.symbolic_worker", "symbolic math", workers, deadline)
        self.deadline = deadline
        self.lock = threading.Lock()
        self.misses = 0

    def equal(self, reference, answer):
        """Whether the LaTeX/plain texts `reference` and `answer` are equal; None past the deadline."""
        return self.call({"op": "equal", "reference": reference, "answer": answer})

    def readable(self, text):
        """Whether `text` parses to a value; None past the deadline."""
        return self.call({"op": "parse", "text": text})

    def call(self, request):
        try:
            return self.pool.call(request)
        except DeadlineExceeded:
            return self.missed(request)

    def missed(self, request):
        with self.lock:
            self.misses += 1
            count = self.misses
        shown = {key: value[:120] for key, value in request.items()}
        logger.warning(
            "symbolic math passed its %gs deadline (%d so far in this process), graded as not equal: %s",
            self.deadline, count, shown,
        )
        return None

    def close(self):
        self.pool.close()


_shared = None
_shared_lock = threading.Lock()


def symbolic_math():
    """The process's SymbolicMath (DEFAULT_WORKERS, DEFAULT_DEADLINE unless `configure`d)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SymbolicMath()
            atexit.register(_shared.close)
        return _shared


def configure(workers=DEFAULT_WORKERS, deadline=DEFAULT_DEADLINE):
    """Replace the process's SymbolicMath (the reward server's --grading_workers, --grading_deadline)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
        _shared = SymbolicMath(workers, deadline)
        atexit.register(_shared.close)
        return _shared
