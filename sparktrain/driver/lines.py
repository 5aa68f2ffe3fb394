"""The ranks' output on the driver: each line prefixed with its rank, and what was not shown.

Tasks forward a bounded share of their ranks' lines (see :mod:`sparktrain.task.logs`), in
batches, with the count of lines they did not forward. Those counts are said here, at most
once per :data:`NOTICE_INTERVAL` seconds per rank and once more when the run ends, with the
file that holds every line when ``log_dir`` is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sparktrain.config import conf_key
from sparktrain.task.logs import LINE_RATE

NOTICE_INTERVAL = 5.0


class LineView:
    """Prints the ranks' lines, and notices of the lines not shown.

    Args:
        show: writes text (one or more lines) where the run's output goes.
    """

    def __init__(self, show: Callable[[str], None]) -> None:
        self._show = show
        # Per rank: lines not shown in all, not yet said, when last said, and where they are.
        self.not_shown: dict[int, int] = {}
        self._unsaid: dict[int, int] = {}
        self._said: dict[int, float] = {}
        self._where: dict[int, str] = {}

    def line(self, rank: int, text: str) -> None:
        """One line of ``rank``'s output."""
        self._show(f"[rank {rank}] {text}")

    def batch(self, message: dict[str, Any]) -> None:
        """A ``logs`` message: its lines, then a notice if lines were dropped and it is due."""
        rank = message["rank"]
        if message["lines"]:
            self._show("\n".join(f"[rank {rank}] {text}" for text in message["lines"]))
        dropped = message["dropped"]
        if dropped:
            self.not_shown[rank] = self.not_shown.get(rank, 0) + dropped
            self._unsaid[rank] = self._unsaid.get(rank, 0) + dropped
            if message["where"]:
                self._where[rank] = message["where"]
            now = time.monotonic()
            if now - self._said.get(rank, -NOTICE_INTERVAL) >= NOTICE_INTERVAL:
                self._notice(rank, now)

    def finish(self) -> None:
        """Say what is still unsaid (once the run has ended)."""
        now = time.monotonic()
        for rank in sorted(self._unsaid):
            self._notice(rank, now)

    def _notice(self, rank: int, now: float) -> None:
        unsaid = self._unsaid.pop(rank, 0)
        if not unsaid:
            return
        self._said[rank] = now
        total = self.not_shown[rank]
        where = self._where.get(rank)
        keep = (
            f"full output in {where}"
            if where
            else f"set log_dir ({conf_key('log_dir')}) to keep every line"
        )
        so_far = f" ({total:,} in all)" if total != unsaid else ""
        self._show(
            f"[rank {rank}] {unsaid:,} lines not shown{so_far}: more than a rank may send to "
            f"the driver ({LINE_RATE:,.0f} lines/s); {keep}"
        )
