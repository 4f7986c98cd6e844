"""How long a wait that could hang a run may last: a deadline derived from the RL steps this process has
timed, so that a frozen sampler or reward server ends a run of sub-second steps within a minute and never
ends a healthy run of long steps.

The trainer times its steps on STEPS (`begin()` when training starts, `step_done()` after each RL step).
Before a step has been timed (loading models, the first batch) a wait may last STARTUP_SECONDS; after,
STEP_FACTOR times the slowest step so far, and at least MIN_SECONDS. A `Deadline` with an override (a
config key the user set) lasts that long instead.

Waits that no timeout of their own bounds (collectives, checkpoint writes, weight publication) run inside
`guarded(...)`: a daemon thread ends the process (exit code EXIT_CODE) when one outlives its deadline,
after logging which wait, at which RL step, and the last event before it. A process blocked in a collective
or a write cannot be interrupted otherwise; PyTorch's NCCL watchdog ends a rank the same way, and the
launcher then stops the others. Checkpoints are written to a temp folder first, so the last complete one
resumes. A timeout the wait raises itself (gloo's 30 s on CPU) leaves with the same description.
"""

import contextlib
import os
import sys
import threading
import time

STARTUP_SECONDS = 1800.0
STEP_FACTOR = 10.0
MIN_SECONDS = 60.0
EXIT_CODE = 3
POLL_SECONDS = 0.5


class StepClock:
    """The RL steps of this process: how many are done (`done`, counting those a resumed run starts from) and
    the slowest one's seconds (None before one is timed)."""

    def __init__(self):
        self.begin()

    def begin(self, steps_done=0):
        self.slowest, self.last, self.done = None, time.monotonic(), steps_done

    def step_done(self):
        now = time.monotonic()
        self.slowest = max(self.slowest or 0.0, now - self.last)
        self.last, self.done = now, self.done + 1
        note(f"RL step {self.done} done")


STEPS = StepClock()


class Deadline:
    """The deadline of a wait: `override` seconds when set (the config key `key`), else derived from STEPS."""

    def __init__(self, override=None, key=None, clock=STEPS):
        self.override, self.key, self.clock = override, key, clock

    def seconds(self):
        if self.override:
            return self.override
        if self.clock.slowest is None:
            return STARTUP_SECONDS
        return max(MIN_SECONDS, STEP_FACTOR * self.clock.slowest)

    def describe(self):
        """The deadline and where it comes from, for an error message."""
        if self.override:
            return f"{self.key}={self.override:g} s"
        setting = f"; {self.key} sets it" if self.key else ""
        if self.clock.slowest is None:
            return f"{STARTUP_SECONDS:.0f} s (no RL step timed yet{setting})"
        return (f"{self.seconds():.0f} s ({STEP_FACTOR:g} x the slowest RL step so far, {self.clock.slowest:.2f} s, "
                f"and at least {MIN_SECONDS:.0f} s{setting})")


class Events:
    """The last event of this process that a stopped wait's message names (a finished wait, a step done)."""

    def __init__(self):
        self.text, self.at = "none yet", time.monotonic()

    def note(self, text):
        self.text, self.at = text, time.monotonic()

    def describe(self, before):
        return f"{self.text}, {before - self.at:.1f} s before it began"


EVENTS = Events()
note = EVENTS.note


class Wait:
    """One guarded wait: what it waits on (`component`: "collective", "checkpoint write" ...) and on what."""

    def __init__(self, component, detail, deadline):
        self.component, self.detail, self.deadline = component, detail, deadline
        self.started, self.last_event = time.monotonic(), EVENTS.describe(time.monotonic())

    def overdue(self, now):
        return now - self.started > self.deadline.seconds()

    def describe(self, what, inner=None):
        now = f"; inside it, now waiting on {inner.component}: {inner.detail}" if inner not in (None, self) else ""
        return (
            f"{self.component} {what}: {self.detail}{now}; {steps_done()}; "
            f"the last event before it: {self.last_event}. A peer rank that stopped, died or fell far behind, or a "
            "stalled file system, ends a run this way; the last complete checkpoint in output_dir resumes it: run the "
            "same command again"
        )


def steps_done():
    return f"after RL step {STEPS.done}" if STEPS.done else "before the first RL step"


class WaitFailed(RuntimeError):
    """A guarded wait ended by a timeout of its own (gloo's on CPU), described as the watchdog describes it."""


class Watchdog:
    """The guarded waits in progress, and the thread that ends the process when one is overdue."""

    def __init__(self):
        self.waits, self.lock, self.thread = [], threading.Lock(), None
        self.waiting = threading.Event()  # set while a guarded wait is in progress: the thread polls only then
        self.poll = threading.Event()  # never set: waiting on it paces the polls
        self.deadline = Deadline(None, "watchdog_timeout")

    def configure(self, override):
        """The config's `watchdog_timeout` (None: derived from the steps)."""
        self.deadline = Deadline(override, "watchdog_timeout")

    @contextlib.contextmanager
    def guarded(self, component, detail):
        wait = Wait(component, detail, self.deadline)
        with self.lock:
            self.waits.append(wait)
            self.waiting.set()
            if self.thread is None:
                self.thread = threading.Thread(target=self.watch, name="watchdog", daemon=True)
                self.thread.start()
        try:
            yield
        except WaitFailed:
            raise
        except RuntimeError as error:
            if "timeout" not in str(error).lower() and "timed out" not in str(error).lower():
                raise
            raise WaitFailed(wait.describe(f"failed after {time.monotonic() - wait.started:.0f} s ({error})")) from error
        else:
            note(f"{component} finished: {detail}")
        finally:
            with self.lock:
                self.waits.remove(wait)
                if not self.waits:
                    self.waiting.clear()

    def watch(self):
        while True:
            # Blocks while nothing is guarded; Event.wait, not time.sleep, so that a test that patches
            # time.sleep never sees this thread.
            self.waiting.wait()
            self.poll.wait(POLL_SECONDS)
            with self.lock:
                overdue = [wait for wait in self.waits if wait.overdue(time.monotonic())]
                innermost = self.waits[-1] if self.waits else None
            if overdue:
                self.stop(overdue[0], innermost)

    @staticmethod
    def stop(wait, innermost):
        message = "watchdog: " + wait.describe(f"did not finish within {wait.deadline.describe()}", innermost)
        message += f". Ending this process with exit code {EXIT_CODE}."
        print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_CODE)


WATCHDOG = Watchdog()
guarded = WATCHDOG.guarded
