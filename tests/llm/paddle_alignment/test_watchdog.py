"""The deadlines of the waits that could hang a run (watchdog.py): derived from the slowest RL step."""

import pytest

from paddle_alignment import watchdog


def test_the_deadline_follows_the_slowest_step(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: now[0])
    steps = watchdog.StepClock()
    deadline = watchdog.Deadline(key="rollout_timeout", clock=steps)
    assert deadline.seconds() == watchdog.STARTUP_SECONDS  # loading models and the first batch
    assert deadline.describe() == "1800 s (no RL step timed yet; rollout_timeout sets it)"
    for seconds in (0.1, 0.3, 0.2):
        now[0] += seconds
        steps.step_done()
    assert deadline.seconds() == watchdog.MIN_SECONDS  # 10 x 0.3 s is less than the floor
    now[0] += 20.0
    steps.step_done()
    assert deadline.seconds() == pytest.approx(200.0)
    assert deadline.describe() == "200 s (10 x the slowest RL step so far, 20.00 s, and at least 60 s; rollout_timeout sets it)"
    steps.begin()  # a new run in this process starts over
    assert deadline.seconds() == watchdog.STARTUP_SECONDS


def test_an_override_is_the_deadline_whatever_the_steps():
    steps = watchdog.StepClock()
    steps.step_done()
    overridden = watchdog.Deadline(5.0, "rollout_timeout", steps)
    assert overridden.seconds() == 5.0 and overridden.describe() == "rollout_timeout=5 s"
