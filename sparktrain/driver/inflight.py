"""What the runs going on in this driver process share: the cluster's task slots, and a stop.

Two runs of one process (a submitted run and a blocking one, or two submitted runs) share the
Spark application's task slots. A barrier stage that finds too few free slots does not fail:
Spark retries it for minutes with only a log line to show. So each run reserves its tasks'
slots here before its capacity check, and the check counts what the other runs of this
process hold, including runs whose tasks Spark has not started yet (which no Spark API
counts). This is the one process-wide table of sparktrain: it describes the process itself.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

# A message a stop request puts on a run's event queue (see RunMonitor.watch).
STOP = "_stop"

_lock = threading.Lock()
# Per Spark application id: the slots each run in flight holds, by the run's token.
_held: dict[str, dict[int, int]] = {}


def held_by_others(application: str, token: int) -> int:
    """Task slots the other runs of this process hold on ``application``."""
    with _lock:
        return sum(n for t, n in _held.get(application, {}).items() if t != token)


@contextlib.contextmanager
def reserve(application: str, slots: int) -> Iterator[int]:
    """Hold ``slots`` task slots of ``application`` while inside; yields this run's token.

    The token names this reservation to :func:`held_by_others`.
    """
    token = id(object()) ^ threading.get_ident()
    with _lock:
        while token in _held.get(application, {}):
            token += 1
        _held.setdefault(application, {})[token] = slots
    try:
        yield token
    finally:
        with _lock:
            runs = _held.get(application, {})
            runs.pop(token, None)
            if not runs:
                _held.pop(application, None)


class StopSignal:
    """A request to stop one run from another thread: the same stop as Ctrl-C in ``run()``.

    The run's monitor listens on its event queue; :meth:`request` puts a :data:`STOP`
    message there (now, or as soon as the run's next attempt attaches its queue), and a
    run that has not launched yet sees :attr:`requested` before it does.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[Any]] = []
        self.requested = False

    def request(self) -> None:
        """Ask the run to stop (idempotent)."""
        with self._lock:
            self.requested = True
            queues = list(self._queues)
        for events in queues:
            events.put((0, {"type": STOP}))

    @contextlib.contextmanager
    def attached(self, events: queue.Queue[Any]) -> Iterator[None]:
        """While inside, a stop request reaches ``events`` (at once, if already made)."""
        with self._lock:
            self._queues.append(events)
            requested = self.requested
        if requested:
            events.put((0, {"type": STOP}))
        try:
            yield
        finally:
            with self._lock:
                self._queues.remove(events)
