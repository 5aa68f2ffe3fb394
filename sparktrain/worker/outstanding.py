"""A rank's queued collectives (NCCL) that its device has not run yet.

A collective on a group whose blocking calls return once the work is queued on the GPU is
issued asynchronously by :mod:`sparktrain.worker.collectives`; its work is kept here until
``work.is_completed()`` (for NCCL: the GPU has run it), and only then counted as completed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# How often a rank's outstanding queued collectives are looked at (seconds): the hang watch
# judges over minutes, and each look is one query of an event per collective outstanding.
SETTLE_EVERY_S = 1.0


class Outstanding:
    """The works of a rank's queued collectives, each counted completed (once) when it is.

    Args:
        leave: counts one collective completed.
        every: seconds between two looks while any work is outstanding.
    """

    def __init__(self, leave: Callable[[], None], every: float = SETTLE_EVERY_S) -> None:
        self._leave = leave
        self._every = every
        self._works: list[Any] = []
        self._cond = threading.Condition()
        self._watcher: threading.Thread | None = None

    def __len__(self) -> int:
        with self._cond:
            return len(self._works)

    def add(self, work: Any) -> None:
        """``work`` was issued: it counts completed once ``work.is_completed()``."""
        with self._cond:
            self._works.append(work)
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="sparktrain-collectives", daemon=True
                )
                self._watcher.start()
            self._cond.notify()

    def settle(self) -> None:
        """Count as completed the works that are (the rest stay outstanding)."""
        with self._cond:
            works = list(self._works)
        self._forget([work for work in works if _completed(work)])

    def drop(self, work: Any) -> None:
        """``work`` failed (its wait raised): count it completed now, unless it was."""
        self._forget([work])

    def _forget(self, works: list[Any]) -> None:
        if not works:
            return
        gone = {id(work) for work in works}
        with self._cond:
            kept = [work for work in self._works if id(work) not in gone]
            left = len(self._works) - len(kept)
            self._works = kept
        for _ in range(left):  # only what this call removed: two callers never count one twice
            self._leave()

    def _watch(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._works))
            time.sleep(self._every)  # a polling period, not a wait for readiness
            self.settle()


def _completed(work: Any) -> bool:
    is_completed = getattr(work, "is_completed", None)
    if is_completed is None:
        return True
    try:
        return bool(is_completed())
    except RuntimeError:
        return True  # it failed: it is over
