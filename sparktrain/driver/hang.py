"""The hang watch: ranks that wait in a collective for a rank that never comes.

Each task tells the driver how many collectives each of its ranks entered and completed
(see :mod:`sparktrain.task.collectives`). When no rank's counts have moved for
``stall_timeout``, the run is hung if

* some ranks are inside a collective and the others are outside any, and each of those
  outside has also been silent that long (no output, no ``report``, no ``log_to_driver``):
  the ranks outside are behind; or
* every rank is inside a collective but they entered different numbers of them: the ranks
  that entered the fewest are behind.

Every rank busy outside any collective (a long computation) is not a hang, nor is a rank
outside a collective that prints or reports (it is working: a save, an evaluation); the stall
watch (:mod:`sparktrain.driver.stall`) covers silence alone. A hang ends the run with
:class:`~sparktrain.errors.RunHungError`, naming the ranks behind, with every rank's stack.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

from sparktrain import contract
from sparktrain.config import RunConfig, conf_key
from sparktrain.errors import RunHungError
from sparktrain.units import format_duration

Counts = tuple[int, int]


def behind(counts: Mapping[int, Counts], silent: Collection[int]) -> list[int]:
    """The ranks that the others wait for, once no count has moved for ``stall_timeout``.

    Args:
        counts: every rank's (collectives entered, completed).
        silent: the ranks that showed no sign of life for ``stall_timeout``.

    Returns:
        The ranks behind, in order; empty when the run is not hung.
    """
    inside = {rank for rank, (entered, completed) in counts.items() if entered > completed}
    outside = sorted(set(counts) - inside)
    if not inside:
        return []  # every rank computes
    if outside:
        return outside if all(rank in silent for rank in outside) else []
    entered = {rank: counts[rank][0] for rank in inside}
    fewest = min(entered.values())
    if fewest == max(entered.values()):
        return []
    return sorted(rank for rank, n in entered.items() if n == fewest)


class HangWatch:
    """When the run's ranks wait in collectives for ranks that never join them.

    Args:
        config: the run's settings (``stall_timeout`` off turns the watch off).
    """

    def __init__(self, config: RunConfig) -> None:
        self.timeout = config.stall_timeout
        # As often as the tasks read the counts (once they have been still that long).
        self.recheck = (
            contract.collectives_interval(self.timeout)
            if self.timeout
            else contract.COLLECTIVES_EVERY_S
        )
        self.counts: dict[int, Counts] = {}
        # The ranks inside a collective now, kept as counts arrive (the monitor asks after
        # every message whether any is: a question that must not cost a pass over the ranks).
        self._inside: set[int] = set()
        self._life: dict[int, float] = {}
        self._moved: float | None = None
        self._looked: float | None = None

    def start(self, now: float, ranks: Iterable[int]) -> None:
        """The ``ranks`` may run from ``now`` (none has entered a collective yet)."""
        self.counts = {rank: (0, 0) for rank in ranks}
        self._inside = set()
        self._moved = now

    def moved(self, rows: Iterable[list[int]], now: float) -> None:
        """A task's ``[rank, entered, completed]`` rows arrived at ``now``."""
        for rank, entered, completed in rows:
            if rank in self.counts and self.counts[rank] != (entered, completed):
                self.counts[rank] = (entered, completed)
                if entered > completed:
                    self._inside.add(rank)
                else:
                    self._inside.discard(rank)
                self._moved = now
                self._looked = None

    def activity(self, rank: int, now: float) -> None:
        """``rank`` printed or reported something at ``now``."""
        self._life[rank] = now

    def first_look(self) -> float | None:
        """When the counts will have been still for ``stall_timeout``, while a rank waits
        inside a collective (the stall watch waits for this look); else None."""
        if self.timeout is None or self._moved is None or not self._inside:
            return None
        return self._moved + self.timeout

    def deadline(self) -> float | None:
        """When to look next (``time.monotonic()``), or None for never."""
        if self.timeout is None or self._moved is None:
            return None
        due = self._moved + self.timeout
        return due if self._looked is None else max(due, self._looked + self.recheck)

    def look(self, now: float) -> list[int]:
        """The ranks behind, when the run is hung at ``now``; else empty."""
        due = self.deadline()
        if due is None or now < due or self._moved is None or self.timeout is None:
            return []
        self._looked = now
        quiet_since = now - self.timeout
        silent = {r for r in self.counts if self._life.get(r, -math.inf) <= quiet_since}
        return behind(self.counts, silent)

    def error(self, ranks: list[int], started: Mapping[int, Mapping[str, object]]) -> RunHungError:
        """The error that ends a hung run, naming the ranks behind (host and pid from
        ``started``, each rank's STARTED message)."""
        timeout = format_duration(self.timeout or 0)

        def who(rank: int) -> str:
            info = started.get(rank, {})
            entered, completed = self.counts[rank]
            where = (
                f"waiting in collective #{entered}"
                if entered > completed
                else f"outside any collective, {completed} done"
            )
            return (
                f"rank {rank} (host {info.get('host', '?')}, pid {info.get('pid', '?')}; {where})"
            )

        waiting = [r for r in sorted(self.counts) if r not in ranks]
        return RunHungError(
            f"the run hung: {', '.join(who(r) for r in ranks)} "
            f"{'is' if len(ranks) == 1 else 'are'} behind, while "
            f"{', '.join(who(r) for r in waiting) or 'the other ranks'} waited, and no "
            f"rank moved for {timeout} (stall_timeout, {conf_key('stall_timeout')}). Every "
            "rank was stopped; each one's stack follows.\nIf a rank works that long alone "
            "on purpose (a save, an evaluation) without printing, raise stall_timeout or "
            "have it print or call sparktrain.report() now and then; stall_timeout='off' "
            "turns the watch off."
        )
