"""Symbolic math (math-verify's LaTeX-to-SymPy parsing and comparison) in worker processes, with a deadline.

A parse can run for minutes on some inputs (`10^{10^{10}}`), and math-verify's own timeout is a SIGALRM,
which only works in a process's main thread: the reward server scores in worker threads. So each call
goes to a worker process (`rewards/symbolic_worker.py`), one line of JSON each way, and a
worker that passes the deadline is killed and replaced; the call counts as a miss (`None`), with a warning
that says how many there have been. Workers start on first use and end with this process (they exit when
their stdin closes).
"""

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE = 5.0  # seconds per call, as math-verify's own default timeout
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
STARTUP_SECONDS = 120.0  # importing SymPy on a loaded machine
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class DeadlineExceeded(Exception):
    pass


class Worker:
    """One worker process; `call` sends a request and waits at most `deadline` seconds for its answer."""

    def __init__(self):
        # The worker imports this very package, wherever it was imported from.
        paths = [PACKAGE_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "paddle_alignment.rewards.symbolic_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            self.read_line(STARTUP_SECONDS, "start")
        except DeadlineExceeded:
            raise RuntimeError(f"the symbolic math worker did not start within {STARTUP_SECONDS:g} s") from None

    def read_line(self, seconds, what):
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            if ready:
                raise RuntimeError(f"the symbolic math worker died during its {what} (its error is in the log above; is math-verify installed?)")
            raise DeadlineExceeded
        return json.loads(line)

    def call(self, request, deadline):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.read_line(deadline, "call")
        if "error" in answer:
            raise RuntimeError(f"symbolic math worker: {answer['error']}")
        return answer["result"]

    def close(self):
        self.process.kill()
        self.process.wait()


class SymbolicMath:
    """Up to `workers` worker processes shared by the calling threads, each call ended after `deadline` s."""

    def __init__(self, workers=DEFAULT_WORKERS, deadline=DEFAULT_DEADLINE):
        if workers < 1:
            raise ValueError(f"symbolic math workers must be >= 1, got {workers}")
        if deadline <= 0:
            raise ValueError(f"symbolic math deadline must be > 0 seconds, got {deadline}")
        self.deadline = deadline
        self.idle = queue.LifoQueue()
        self.slots = threading.BoundedSemaphore(workers)
        self.lock = threading.Lock()
        self.misses = 0

    def equal(self, reference, answer):
        """Whether the LaTeX/plain texts `reference` and `answer` are equal; None past the deadline."""
        return self.call({"op": "equal", "reference": reference, "answer": answer})

    def readable(self, text):
        """Whether `text` parses to a value; None past the deadline."""
        return self.call({"op": "parse", "text": text})

    def call(self, request):
        with self.slots:
            try:
                worker = self.idle.get_nowait()
            except queue.Empty:
                worker = Worker()
            try:
                result = worker.call(request, self.deadline)
            except DeadlineExceeded:
                return self.missed(request)
            except BaseException:
                worker.close()
                raise
            self.idle.put(worker)
            return result

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
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


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
