"""What a frame server says of the connections that ended without authenticating.

A flood can end thousands of connections a second, so they are counted, not logged one by
one: the first at once, then what came since at most once per :data:`LOG_INTERVAL` seconds
(the server's loop calls :meth:`DropLog.flush` on its timer, so a count is said even when no
further connection comes), and the rest when the server closes. Peers that hung up before
authenticating are counted beside the drops, and said only once something was dropped (a port
check that connects and leaves is no attack). The counts the log gives add up to
:attr:`DropLog.dropped` and :attr:`DropLog.left`.
"""

from __future__ import annotations

import logging
import time

LOG_INTERVAL = 10.0

_log = logging.getLogger("sparktrain.wire")


class DropLog:
    """Counts of unauthenticated connections that ended, and their rate-limited log lines.

    Args:
        name: the server's name, first in each line.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        # Dropped by the server: failed authentication or framing, too slow, over the limits.
        self.dropped = 0
        # Closed by their peer (or reset) before they authenticated.
        self.left = 0
        self._unsaid_dropped = 0
        self._unsaid_left = 0
        self._latest = ""
        self._last_log = -LOG_INTERVAL

    def drop(self, why: str) -> None:
        """The server dropped a connection, for ``why``."""
        self.dropped += 1
        self._unsaid_dropped += 1
        self._latest = why
        self.flush(time.monotonic())

    def gone(self) -> None:
        """A connection's peer closed it before it authenticated."""
        self.left += 1
        self._unsaid_left += 1

    def due(self) -> float | None:
        """When :meth:`flush` has something to say (``time.monotonic()``), if it has."""
        if not self.dropped or not (self._unsaid_dropped or self._unsaid_left):
            return None
        return self._last_log + LOG_INTERVAL

    def flush(self, now: float, last: bool = False) -> None:
        """Say what was not said yet, if the last line is old enough (or ``last``)."""
        if not self.dropped or not (self._unsaid_dropped or self._unsaid_left):
            return  # peers that hung up alone are no attack: said only beside drops
        if not last and now - self._last_log < LOG_INTERVAL:
            return
        dropped, left = self._unsaid_dropped, self._unsaid_left
        self._unsaid_dropped = self._unsaid_left = 0
        self._last_log = now
        latest = f" (latest: {self._latest})" if dropped else ""
        _log.warning(
            "%s: %d connection(s) dropped that failed authentication or framing, were too "
            "slow, or were over the limits%s, %d closed by their peer before authenticating%s",
            self.name,
            dropped,
            latest,
            left,
            f" (in all: {self.dropped} dropped, {self.left} closed)" if last else "",
        )
