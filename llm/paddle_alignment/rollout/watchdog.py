"""How long the decoupled rollout's waits may last before the run stops: a deadline derived from the RL steps
measured so far, so that a frozen sampler ends a run of 0.1 s steps within a minute and never ends a healthy
run of 10-minute steps.

Before any step has been timed (loading models, the first batch) a wait may last STARTUP_SECONDS; after,
STEP_FACTOR times the slowest step so far, and at least MIN_SECONDS. `rollout_timeout`, when set, is the
deadline of every wait instead.
"""

import time

STARTUP_SECONDS = 1800.0
STEP_FACTOR = 10.0
MIN_SECONDS = 60.0


class StepDeadline:
    """The deadline of the next wait: `begin()` when training starts, `step_done()` after each RL step."""

    def __init__(self, override=None):
        self.override = override
        self.slowest = None
        self.last = time.monotonic()

    def begin(self):
        self.last = time.monotonic()

    def step_done(self):
        now = time.monotonic()
        self.slowest = max(self.slowest or 0.0, now - self.last)
        self.last = now

    def seconds(self):
        if self.override:
            return self.override
        if self.slowest is None:
            return STARTUP_SECONDS
        return max(MIN_SECONDS, STEP_FACTOR * self.slowest)

    def describe(self):
        """The deadline and where it comes from, for an error message."""
        if self.override:
            return f"rollout_timeout={self.override:g} s"
        if self.slowest is None:
            return f"{STARTUP_SECONDS:.0f} s (no RL step timed yet; rollout_timeout sets it)"
        return (f"{self.seconds():.0f} s ({STEP_FACTOR:g} x the slowest RL step so far, {self.slowest:.2f} s, and at "
                f"least {MIN_SECONDS:.0f} s; rollout_timeout sets it)")
