"""The deadlines of the waits that could hang a run (watchdog.py): derived from the slowest RL step; the
watchdog that ends a process whose guarded wait outlives its deadline."""

import os
import re
import subprocess
import sys
import textwrap
import threading
import time

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


def run_guarded(body, timeout=60):
    """`body` (Python statements, `watchdog` imported) in a fresh process: (exit code, stderr, seconds)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", "from paddle_alignment import watchdog\n" + textwrap.dedent(body)],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    return result.returncode, result.stderr, time.monotonic() - started


def test_an_overdue_wait_ends_the_process_naming_the_wait_the_step_and_the_last_event():
    code, stderr, seconds = run_guarded("""
        import time
        watchdog.WATCHDOG.configure(1.0)
        watchdog.STEPS.begin(7)
        watchdog.STEPS.step_done()
        with watchdog.guarded("checkpoint write", "out/checkpoint-8"):
            with watchdog.guarded("collective", "a barrier over 2 ranks"):
                time.sleep(60)
    """)
    assert code == watchdog.EXIT_CODE, stderr
    assert seconds < 20
    assert re.search(
        r"watchdog: checkpoint write did not finish within watchdog_timeout=1 s: out/checkpoint-8; inside it, now "
        r"waiting on collective: a barrier over 2 ranks; after RL step 8; the last event before "
        r"it: RL step 8 done, 0\.\d s before it began\. .*run the same command again\. Ending this process with exit "
        r"code 3\.", stderr,
    ), stderr


def test_a_wait_within_its_deadline_passes_and_becomes_the_last_event():
    code, stderr, _ = run_guarded("""
        import time
        watchdog.WATCHDOG.configure(2.0)
        for _ in range(3):
            with watchdog.guarded("weight publication", "policy version 1 into rollout"):
                time.sleep(1.0)
        assert watchdog.EVENTS.text == "weight publication finished: policy version 1 into rollout"
        assert watchdog.WATCHDOG.waits == []
    """)
    assert code == 0, stderr


def test_a_timeout_raised_inside_a_wait_is_described_once_and_other_errors_pass_unchanged():
    watchdog.STEPS.begin()
    with pytest.raises(watchdog.WaitFailed) as raised:
        with watchdog.guarded("checkpoint write", "out/checkpoint-2"):
            with watchdog.guarded("collective", "a barrier over 2 ranks"):
                raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT self_rank = none")
    message = str(raised.value)
    assert message.startswith("collective failed after 0 s ([gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT")
    assert ": a barrier over 2 ranks; before the first RL step; the last event" in message and message.count("failed after") == 1
    with pytest.raises(RuntimeError, match="^shapes differ$"):
        with watchdog.guarded("collective", "a sum over 2 ranks"):
            raise RuntimeError("shapes differ")
    assert watchdog.WATCHDOG.waits == []


def test_the_watchdog_thread_sleeps_on_events_only(monkeypatch):
    """Tests patch time.sleep (the reward client's backoff): the thread must neither call it nor spin."""
    calls = []
    monkeypatch.setattr(watchdog.time, "sleep", calls.append)
    with watchdog.guarded("checkpoint write", "out/checkpoint-2"):
        threading.Event().wait(3 * watchdog.POLL_SECONDS)
    threading.Event().wait(3 * watchdog.POLL_SECONDS)  # idle: the thread blocks until the next guarded wait
    assert calls == [] and watchdog.WATCHDOG.thread.is_alive() and not watchdog.WATCHDOG.waiting.is_set()
