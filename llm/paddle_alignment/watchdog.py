"""How long a wait that could hang a run may last: a deadline derived from the RL steps this process has
timed, so that a frozen sampler or reward server ends a run of 0.1 s steps within a minute and never ends a
healthy run of 10-minute steps.

The trainer times its steps on STEPS (`begin()` when training starts, `step_done()` after each RL step).
Before a step has been timed (loading models, the first batch) a wait may last STARTUP_SECONDS; after,
STEP_FACTOR times the slowest step so far, and at least MIN_SECONDS. A `Deadline` with an override (a
config key the user set) lasts that long instead.
"""

import time

STARTUP_SECONDS = 1800.0
STEP_FACTOR = 10.0
MIN_SECONDS = 60.0


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
