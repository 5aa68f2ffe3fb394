"""What the runs going on in this driver process share: the cluster's task slots, and a stop.

Two runs of one process (a submitted run and a blocking one, or two submitted runs) share the
Spark application's task slots. A barrier stage that finds too few free slots does not fail:
Spark retries it for minutes with only a log line to show. So each run reserves its tasks'
slots here before its capacity check, and the check counts what the other runs of this
process hold, including runs whose tasks Spark has not started yet (which no Spark API
counts). A run that does not fit beside them waits its turn, in the order runs were
submitted (``queue_wait`` bounds the wait; 0 refuses at once). This is the one process-wide
table of sparktrain: it describes the process itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from typing import Any

# A message a stop request puts on a run's event queue (see RunMonitor.watch).
STOP = "_stop"
# How often a run waiting its turn reads the cluster's size again: executors that register
# or are lost change it, and Spark tells Python of neither.
RECHECK = 5.0

_lock = threading.Lock()
# Told when a run takes or gives back its slots, and when a stop is requested.
_changed = threading.Condition(_lock)
_tickets = itertools.count()


@dataclasses.dataclass
class Place:
    """A run's place among the runs of this process on one Spark application.

    Attributes:
        application: the Spark application id.
        slots: the task slots the run needs.
        ticket: its turn: lower tickets were submitted first.
        admitted: whether it holds its slots (it may launch), or still waits its turn.
    """

    application: str
    slots: int
    ticket: int
    admitted: bool = False


# Per Spark application id: the places of the runs in flight, by the run's token.
_places: dict[str, dict[int, Place]] = {}
# Tickets of submitted runs whose thread has not taken its place yet (nor ended): a later run
# waits for them, or a slow thread would let a run submitted after it go first.
_coming: set[int] = set()


def next_ticket() -> int:
    """A turn in line, taken when a run is submitted (so turns follow submission order)."""
    return next(_tickets)


def expect(ticket: int) -> None:
    """The run of ``ticket`` is on its way: later runs wait until it takes its place or ends."""
    with _lock:
        _coming.add(ticket)


def forget(ticket: int) -> None:
    """The run of ``ticket`` will not take a place (it needs no slots, or it ended)."""
    with _changed:
        if ticket in _coming:
            _coming.discard(ticket)
            _changed.notify_all()


def held_by_others(application: str, token: int) -> int:
    """Task slots the other runs of this process hold on ``application``."""
    with _lock:
        return _held(application, token)


def _held(application: str, token: int) -> int:
    runs = _places.get(application, {})
    return sum(p.slots for t, p in runs.items() if t != token and p.admitted)


@contextlib.contextmanager
def reserve(
    application: str, slots: int, ticket: int | None = None, admitted: bool = True
) -> Iterator[int]:
    """A place for ``slots`` task slots of ``application`` while inside; yields its token.

    The token names the place to :func:`held_by_others` and :func:`take_turn`. With
    ``admitted=False`` the place only waits in line until :func:`take_turn` admits it.
    """
    place = Place(application, slots, next_ticket() if ticket is None else ticket, admitted)
    token = id(place) ^ threading.get_ident()
    with _changed:
        while token in _places.get(application, {}):
            token += 1
        _places.setdefault(application, {})[token] = place
        _coming.discard(place.ticket)
        _changed.notify_all()  # the runs behind it see it ahead of them now
    try:
        yield token
    finally:
        with _changed:
            runs = _places.get(application, {})
            runs.pop(token, None)
            if not runs:
                _places.pop(application, None)
            _changed.notify_all()


@dataclasses.dataclass(frozen=True)
class Line:
    """What a run waits for, shown on its handle while it waits its turn."""

    slots: int
    held: int
    total: int
    position: int

    def __str__(self) -> str:
        return (
            f"waiting for {self.slots} task slot{'s' if self.slots != 1 else ''} "
            f"(other runs of this process hold {self.held} of the cluster's {self.total}), "
            f"{ordinal(self.position)} in line"
        )


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ... ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def take_turn(
    application: str,
    token: int,
    total: Callable[[], int],
    wait: float | None,
    refuse: Callable[[Line, bool], BaseException],
    stop: StopSignal | None = None,
    on_wait: Callable[[Line | None], None] | None = None,
    most: int | None = None,
) -> int:
    """Wait until the run of ``token`` may take its slots: every run submitted before it has
    taken its own, and its slots fit beside what the runs going hold. Then take them.

    A run that could never fit, even alone, is let through at once: the capacity check then
    says why. "Never" is what the application's settings say (``most``), not the live count
    of slots: an executor lost a moment (and replaced) would otherwise let a run that only
    waits for the others through, to be refused beside them. Where the settings do not
    bound the slots, a run the live count cannot hold waits its turn like any other; alone,
    it goes on (the capacity check waits for executors to register, or says why not).

    Args:
        application: the Spark application id.
        token: the run's place, from :func:`reserve` with ``admitted=False``.
        total: the cluster's task slots now.
        wait: seconds to wait in line at most (0: not at all; None: as long as it takes).
        refuse: the error to raise when the run may not wait (longer), given what it waits
            for and whether it waited at all.
        stop: a stop request ends the wait with CancelledError.
        on_wait: told what the run waits for, and None once it has its turn.
        most: the most slots the application's settings ever give it; None: not bounded.

    Returns:
        The slots the other runs of this process hold once this one has its turn.

    Raises:
        CancelledError: a stop was requested while waiting.
        BaseException: what ``refuse`` gives.
    """
    started = time.monotonic()
    waited: Line | None = None
    try:
        while True:
            # The cluster's size matters only beside other runs (a Py4J call: not under the lock).
            slots_now = None if _alone(application, token) else total()
            with _changed:
                turn = _admit(application, token, slots_now, most)
                if turn is None:
                    continue  # another run came meanwhile: read the cluster's size
                if not isinstance(turn, Line):
                    return turn  # admitted: the slots the other runs hold
                left = _time_left(turn, waited is not None, started, wait, stop, refuse)
                if turn != waited:
                    waited = turn
                    if on_wait is not None:
                        on_wait(turn)
                _changed.wait(RECHECK if left is None else min(left, RECHECK))
    finally:
        if on_wait is not None:
            on_wait(None)


def _alone(application: str, token: int) -> bool:
    """Whether no other run of this process holds slots of ``application`` or is ahead of
    the run of ``token``."""
    with _lock:
        runs = _places.get(application, {})
        return _held(application, token) == 0 and not _ahead(runs, runs[token])


def _admit(
    application: str, token: int, slots_now: int | None, most: int | None
) -> int | Line | None:
    """With the lock held: admit the run of ``token`` if it is its turn (see :func:`take_turn`).

    Args:
        slots_now: the cluster's task slots; None where the run was found alone.

    Returns:
        The slots the other runs hold, once admitted; else the :class:`Line` it waits in;
        None where it was found alone and another run came since (read the size then).
    """
    runs = _places.get(application, {})
    place = runs[token]
    ahead = _ahead(runs, place)
    held = _held(application, token)
    if slots_now is None:
        if held or ahead:
            return None
        slots_now = place.slots  # alone: whatever the size, it is its turn
    fits = held == 0 or slots_now - held >= place.slots
    never = most is not None and most < place.slots
    if not ahead and (fits or never):
        place.admitted = True
        _changed.notify_all()  # the next in line may fit beside it
        return held
    return Line(place.slots, held, slots_now, len(ahead) + 1)


def _time_left(
    line: Line,
    waited: bool,
    started: float,
    wait: float | None,
    stop: StopSignal | None,
    refuse: Callable[[Line, bool], BaseException],
) -> float | None:
    """Seconds a run waiting in ``line`` since ``started`` may wait on (None: no bound);
    ``waited``: whether it has waited already (``refuse`` is told).

    Raises:
        CancelledError: a stop was requested.
        BaseException: what ``refuse`` gives, where the run may wait no longer.
    """
    if stop is not None and stop.requested:
        raise CancelledError(f"cancelled while {line}")
    left = None if wait is None else wait - (time.monotonic() - started)
    if left is not None and left <= 0:
        raise refuse(line, waited)
    return left


def _ahead(runs: dict[int, Place], place: Place) -> list[Place | int]:
    """The runs submitted before ``place`` that wait their turn, or have yet to take a place."""
    waiting: list[Place | int] = [
        p for p in runs.values() if not p.admitted and p.ticket < place.ticket
    ]
    return waiting + [t for t in _coming if t < place.ticket]


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
        with _changed:  # a run waiting its turn stops waiting
            _changed.notify_all()

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
