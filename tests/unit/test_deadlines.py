"""Deadlines: the monitor's named timers, and how long it may wait for its next event."""

from __future__ import annotations

import queue
import threading

import pytest

from sparktrain.driver.deadlines import (
    CANCEL,
    DRAIN,
    RENDEZVOUS,
    RUN,
    STOP,
    Deadlines,
    next_event,
)


def test_the_wait_runs_to_the_nearest_deadline_and_unset_ones_do_not_count() -> None:
    timers = Deadlines()
    assert timers.wait(100.0) is None  # nothing set: wait for the next event however long
    timers.set(RUN, 160.0)
    timers.set(RENDEZVOUS, 130.0)
    timers.set(STOP, None)  # None leaves it unset
    assert STOP not in timers and RUN in timers
    assert timers.wait(100.0) == 30.0
    assert timers.wait(100.0, skip=(RENDEZVOUS,)) == 60.0  # every task has arrived
    timers.clear(RUN, RENDEZVOUS)
    assert timers.wait(100.0) is None


def test_due_and_ahead_read_the_clock_given() -> None:
    timers = Deadlines()
    timers.set(CANCEL, 50.0)
    assert not timers.due(CANCEL, 49.9) and timers.ahead(CANCEL, 49.9)
    assert timers.due(CANCEL, 50.0) and not timers.ahead(CANCEL, 50.0)
    assert not timers.due(STOP, 1e9) and not timers.ahead(STOP, 0.0)  # unset: neither
    assert timers.wait(60.0) == 0.0  # a passed deadline is due now


def test_a_passed_drain_wakes_nothing_while_a_stop_is_confirmed() -> None:
    """After the launch ended, the last messages are awaited until DRAIN; once it passed, a
    pending stop's confirmation is awaited until STOP, not in a loop that never sleeps."""
    timers = Deadlines()
    timers.set(DRAIN, 10.0)
    timers.set(STOP, 40.0)
    assert timers.wait(5.0) == 5.0
    assert timers.wait(12.0) == 28.0


def test_next_event_returns_what_arrives_and_raises_empty_after_its_wait() -> None:
    events: queue.Queue[object] = queue.Queue()
    threading.Timer(0.3, events.put, args=("hello",)).start()
    assert next_event(events, None) == "hello"  # no deadline: it waits as long as it takes
    with pytest.raises(queue.Empty):
        next_event(events, 0.05)
