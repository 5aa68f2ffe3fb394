"""The monitor's clock: its named deadlines, and a wait on its event queue until the next.

A run has up to seven deadlines at once (every task at the rendezvous, the run's timeout, the
ranks' confirmation of a stop, the launch's end after a cancel, the last messages after the
end, and the stall and hang watches' next looks); :class:`Deadlines` keeps them by name, says
which is due, and how long the monitor may wait for its next event.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterable
from typing import Any

# A signal the kernel hands to another thread of this process (any thread may take a
# process-directed SIGINT, e.g. when the main thread already has a signal pending) only sets
# Python's flag: a main thread blocked on a lock is not woken, and the handler (Ctrl-C's
# KeyboardInterrupt) runs only once it is back in the interpreter. So the wait is cut in slices.
SIGNAL_SLICE = 0.25

# Every task has said hello (start_timeout after the launch).
RENDEZVOUS = "rendezvous"
# The run's timeout.
RUN = "run"
# The tasks confirm that their ranks stopped (grace period and slack after a stop).
STOP = "stop"
# The launch reports its end after a forced cancel.
CANCEL = "cancel"
# The tasks' last messages arrive after the launch ended.
DRAIN = "drain"
# The stall watch looks again.
STALL = "stall"
# The hang watch looks again.
HANG = "hang"


class Deadlines:
    """Named instants on the ``time.monotonic()`` clock; a name is set, or not."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def set(self, name: str, at: float | None) -> None:
        """Set ``name`` to the instant ``at``; None unsets it."""
        if at is None:
            self._at.pop(name, None)
        else:
            self._at[name] = at

    def clear(self, *names: str) -> None:
        """Unset ``names``."""
        for name in names:
            self._at.pop(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self._at

    def due(self, name: str, now: float) -> bool:
        """Whether ``name`` is set and its instant has come."""
        at = self._at.get(name)
        return at is not None and now >= at

    def ahead(self, name: str, now: float) -> bool:
        """Whether ``name`` is set and its instant is still to come."""
        at = self._at.get(name)
        return at is not None and now < at

    def wait(self, now: float, skip: Iterable[str] = ()) -> float | None:
        """Seconds until the next deadline not in ``skip`` (0 when one is due); None when
        there is none. A passed ``DRAIN`` only ends the draining: it wakes nothing again."""
        left = set(skip)
        instants = [
            at
            for name, at in self._at.items()
            if name not in left and not (name == DRAIN and at <= now)
        ]
        return max(0.0, min(instants) - now) if instants else None


def next_event(events: queue.Queue[Any], wait: float | None) -> Any:
    """Return the next event, or raise ``queue.Empty`` once ``wait`` seconds passed (never, for
    None), waking every ``SIGNAL_SLICE`` seconds so that a pending Ctrl-C is raised at once."""
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        left = SIGNAL_SLICE if deadline is None else deadline - time.monotonic()
        try:
            return events.get(timeout=max(0.0, min(SIGNAL_SLICE, left)))
        except queue.Empty:
            if deadline is not None and time.monotonic() >= deadline:
                raise
