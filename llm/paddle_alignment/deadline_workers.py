"""Calls that may run for minutes or forever, run in worker processes with a deadline per call.

A thread cannot be stopped, and a SIGALRM only fires in a process's main thread, so a call that may hang (a
symbolic parse of `10^{10^{10}}`, a user's tool) goes to a worker process: one line of JSON each way over its
stdin and stdout. A worker that passes the deadline is killed and replaced, and the call raises
DeadlineExceeded for the caller to count; an exception inside the call comes back as `CallFailed` naming
the worker. Workers start on first use and end with this process (they exit when their stdin closes).

Used by the math rewards' symbolic comparison (rewards/symbolic.py) and by tool calls (agents/tools.py). A
worker module's main is `serve(handle)`: `handle(request) -> result`, both JSON-serialisable.
"""

import json
import os
import queue
import select
import subprocess
import sys
import threading

STARTUP_SECONDS = 120.0  # importing SymPy, or a user's tool module, on a loaded machine
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DeadlineExceeded(Exception):
    pass


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
        self.process = subprocess.Popen(
            [sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
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
    """Up to `workers` processes of `module`, shared by the calling threads, each call ended after `deadline` s."""

    def __init__(self, module, name, workers, deadline):
        if workers < 1:
            raise ValueError(f"{name} workers must be >= 1, got {workers}")
        if deadline <= 0:
            raise ValueError(f"{name} deadline must be > 0 seconds, got {deadline}")
        self.module, self.name, self.deadline = module, name, deadline
        self.idle = queue.LifoQueue()
        self.slots = threading.BoundedSemaphore(workers)

    def call(self, request):
        """The worker's result for `request`; DeadlineExceeded past the deadline (the worker is replaced)."""
        with self.slots:
            try:
                worker = self.idle.get_nowait()
            except queue.Empty:
                worker = Worker(self.module, self.name)
            try:
                result = worker.call(request, self.deadline)
            except BaseException:
                worker.close()  # past the deadline it is closed already; closing again does nothing
                raise
            self.idle.put(worker)
            return result

    def close(self):
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


def serve(handle, warm=None):
    """A worker's main loop: `warm()` once, "ready", then one JSON answer per JSON request line on stdin."""
    if warm is not None:
        warm()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            print(json.dumps({"result": handle(json.loads(line))}), flush=True)
        except Exception as error:  # noqa: BLE001 - the caller raises it with the request's context
            print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
