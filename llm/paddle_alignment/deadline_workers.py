"""Calls that may run for minutes or forever, run in worker processes with a deadline per call.

A thread cannot be stopped, and a SIGALRM only fires in a process's main thread, so a call that may hang (a
symbolic parse of `10^{10^{10}}`, a user's tool) goes to a worker process: one line of JSON each way over its
stdin and stdout. A worker that passes the deadline is killed and replaced, and the call raises
DeadlineExceeded for the caller to count; an exception inside the call comes back as `CallFailed` naming
the worker. Workers start on first use and end with this process (they exit when their stdin closes).

Work made of many calls (a reward request's rows) can also end as a whole: `run_concurrently` runs such calls
on threads with one budget, inside which every pool call ends by the budget's end too (BudgetSpent).

A worker ends when the process that started it does, however that one ends (a SIGKILL included), even in the
middle of a call (Linux's parent-death signal).

Used by the math rewards' symbolic comparison (rewards/symbolic.py) and by tool calls (agents/tools.py). A
worker module's main is `serve(handle)`: `handle(request) -> result`, both JSON-serialisable.
"""

import contextvars
import functools
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

STARTUP_SECONDS = 120.0  # importing SymPy, or a user's tool module, on a loaded machine
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARENT_ENV = "DEADLINE_WORKER_PARENT"  # the pid a worker checks its parent against
CONCURRENT_CALLS = 32  # threads of run_concurrently; most wait on a pool's workers, not on the CPU

# The monotonic time by which the calls of this context must end: run_concurrently's budget.
_budget_end = contextvars.ContextVar("deadline_workers_budget_end", default=None)


class DeadlineExceeded(Exception):
    pass


class BudgetSpent(Exception):
    """The budget of the work a call belongs to ended before the call could (see run_concurrently)."""


class CallFailed(RuntimeError):
    """The call raised inside the worker: `error` is its "Type: message"."""

    def __init__(self, name, error):
        super().__init__(f"{name} worker: {error}")
        self.error = error


class Worker:
    """One worker process running `module`; `call` sends a request and waits at most `deadline` seconds."""

    def __init__(self, module, name):
        self.name = name
        # The worker imports this very package, wherever it was imported from.
        paths = [PACKAGE_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        env[PARENT_ENV] = str(os.getpid())
        self.process = spawn([sys.executable, "-m", module], env)
        try:
            self.read_line(STARTUP_SECONDS, "start")
        except DeadlineExceeded:
            raise RuntimeError(f"the {name} worker did not start within {STARTUP_SECONDS:g} s") from None

    def read_line(self, seconds, what):
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            if ready:
                raise RuntimeError(f"the {self.name} worker died during its {what} (its error is in the log above)")
            raise DeadlineExceeded
        return json.loads(line)

    def call(self, request, deadline):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.read_line(deadline, "call")
        if "error" in answer:
            raise CallFailed(self.name, answer["error"])
        return answer["result"]

    def close(self):
        self.process.kill()
        self.process.wait()


class WorkerPool:
    """Up to `workers` processes of `module`, shared by the calling threads, each call ended after `deadline` s
    (or at the end of the budget it runs in, whichever comes first)."""

    def __init__(self, module, name, workers, deadline):
        if workers < 1:
            raise ValueError(f"{name} workers must be >= 1, got {workers}")
        if deadline <= 0:
            raise ValueError(f"{name} deadline must be > 0 seconds, got {deadline}")
        self.module, self.name, self.deadline = module, name, deadline
        self.idle = queue.LifoQueue()
        self.slots = threading.BoundedSemaphore(workers)
        self.lock = threading.Lock()
        self.live = set()  # every started worker, busy or idle, so that close() ends them all
        self.closed = False

    def call(self, request):
        """The worker's result for `request`; DeadlineExceeded past the deadline (the worker is replaced),
        BudgetSpent when the budget of the calling context ends first."""
        if not self.slots.acquire(timeout=budget_left()):
            raise BudgetSpent
        try:
            worker = self.checkout()
            left = budget_left()
            seconds = self.deadline if left is None else min(self.deadline, left)
            try:
                result = worker.call(request, seconds)
            except BaseException as error:
                self.retire(worker)
                if isinstance(error, DeadlineExceeded) and seconds < self.deadline:
                    raise BudgetSpent from None
                raise
            self.idle.put(worker)
            return result
        finally:
            self.slots.release()

    def checkout(self):
        """An idle worker, else a new one."""
        if self.closed:
            raise RuntimeError(f"the {self.name} workers are closed")
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            pass
        worker = Worker(self.module, self.name)
        with self.lock:
            self.live.add(worker)
            closed = self.closed
        if closed:  # close() ran while this worker started
            self.retire(worker)
            raise RuntimeError(f"the {self.name} workers are closed")
        return worker

    def retire(self, worker):
        with self.lock:
            self.live.discard(worker)
        worker.close()  # past the deadline it is closed already; closing again does nothing

    def close(self):
        """End every worker, busy ones included: a call in flight then fails at once."""
        with self.lock:
            self.closed = True
            workers, self.live = list(self.live), set()
        for worker in workers:
            worker.close()


_spawner = ThreadPoolExecutor(1, thread_name_prefix="worker-spawner")


def spawn(argv, env):
    """Start a worker from one thread that lives as long as this process: Linux's parent-death signal
    (exit_with_parent) follows the thread that started a process, and callers' threads may end sooner."""
    popen = functools.partial(subprocess.Popen, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    return _spawner.submit(popen, argv).result()


def budget_left():
    """Seconds left in the calling context's budget (None without one: no limit)."""
    end = _budget_end.get()
    return None if end is None else max(end - time.monotonic(), 0.0)


# Threads start on first use, as the spawner's do.
_executor = ThreadPoolExecutor(CONCURRENT_CALLS, thread_name_prefix="concurrent-calls")


def run_concurrently(calls, budget=None):
    """Run the zero-argument `calls` on threads, together at most `budget` seconds (None: no limit): each call's
    pool calls end by then too (BudgetSpent). Returns one (result, error) per call, in order; a call still
    running when the budget ends gets (None, BudgetSpent()) and is left to end on its own."""
    end = None if budget is None else time.monotonic() + budget

    def within_budget(call):
        token = _budget_end.set(end)
        try:
            return call()
        finally:
            _budget_end.reset(token)

    futures = [_executor.submit(within_budget, call) for call in calls]
    wait(futures, timeout=budget)
    outcomes = []
    for future in futures:
        if not future.done() and (future.cancel() or not future.done()):
            outcomes.append((None, BudgetSpent()))
        elif future.exception() is not None:
            outcomes.append((None, future.exception()))
        else:
            outcomes.append((future.result(), None))
    return outcomes


def exit_with_parent():
    """Have Linux SIGKILL this worker when the thread that started it ends (see spawn): a watching thread would
    not do, since a long computation in C (SymPy's big integers) holds the interpreter until it is done."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere a worker ends when its stdin closes, after the call it is in
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(os.environ[PARENT_ENV]):  # the parent ended before the line above
        os._exit(1)


def serve(handle, warm=None):
    """A worker's main loop: `warm()` once, "ready", then one JSON answer per JSON request line on stdin."""
    exit_with_parent()
    if warm is not None:
        warm()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            print(json.dumps({"result": handle(json.loads(line))}), flush=True)
        except Exception as error:  # noqa: BLE001 - the caller raises it with the request's context
            print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
