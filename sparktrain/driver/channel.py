"""The driver's authenticated service: tasks report logs, progress and failures here.

Messages are put on one queue as ``(connection id, message)``; the run's monitor is the only
consumer. The frames, their authentication and the bounds on connections are
:class:`~sparktrain.wire.server.FrameServer`'s; a connection that sends anything
unauthenticated or oversized is dropped and counted in :attr:`ChannelServer.rejected`.

The queue is bounded by backpressure, not by dropping: once :data:`INBOX_HIGH` messages wait,
a connection that delivers one more is no longer read until the monitor has brought the queue
down to :data:`INBOX_LOW`. Its task's sender then waits in TCP (a task forwards its ranks'
output from a bounded buffer of its own, so the ranks never wait for it), while connections
that were not sending are read as before: a chatty task cannot hold back another's lines by
more than the time the monitor takes to work through :data:`INBOX_HIGH` messages.
"""

from __future__ import annotations

import queue
from typing import Any

from sparktrain.wire.server import FrameServer

CLOSED = "_closed"
# The inbox's bounds (messages): reading pauses above HIGH and resumes at LOW.
INBOX_HIGH = 1024
INBOX_LOW = 256
# Connections beyond one per task and one per rank: a restarted rank's reconnect, a probe.
CONNECTION_SLACK = 64

Event = tuple[int, dict[str, Any]]


def max_connections(world_size: int) -> int:
    """How many authenticated connections a run of ``world_size`` ranks may hold: one per
    task and one per rank (a rank's own ``report()`` / ``log_to_driver()``), with slack."""
    return 2 * max(1, world_size) + CONNECTION_SLACK


def max_pending(world_size: int) -> int:
    """How many connections may wait to authenticate at once: every task of a run may
    connect at the same moment, so one per rank (at least 64); beyond it the oldest is dropped
    to make room, so a flood cannot lock the tasks out."""
    return max(64, world_size)


class _Inbox(queue.Queue[Event]):
    """The events queue; taking one when it is short again resumes paused connections."""

    def __init__(self) -> None:
        super().__init__()
        self.server: FrameServer | None = None
        self.paused = False

    def _get(self) -> Event:
        item = super()._get()
        if self.paused and self._qsize() <= INBOX_LOW and self.server is not None:
            self.paused = False
            self.server.resume()
        return item

    def room(self) -> bool:
        """Whether the monitor can take more now (called on the server's thread)."""
        with self.mutex:  # _get runs under it too: no resume can be missed
            if self._qsize() < INBOX_HIGH:
                return True
            self.paused = True
            return False


class ChannelServer(FrameServer):
    """A TCP server for one run; its messages arrive on :attr:`events`.

    Args:
        key: the run's HMAC key.
        bind: address to listen on (``127.0.0.1`` for local runs, ``0.0.0.0`` for clusters).
        advertise: the host name or address tasks should connect to.
        world_size: the run's number of ranks; it sets how many connections may authenticate
            (:func:`max_connections`).

    Raises:
        ConfigurationError: the driver process may not open enough files for that many.
    """

    def __init__(
        self,
        key: bytes,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
        world_size: int = 64,
    ) -> None:
        inbox = _Inbox()
        self.events: queue.Queue[Event] = inbox
        super().__init__(
            key,
            lambda conn_id, message: inbox.put((conn_id, message)),
            lambda conn_id: inbox.put((conn_id, {"type": CLOSED})),
            bind=bind,
            advertise=advertise,
            max_connections=max_connections(world_size),
            max_pending=max_pending(world_size),
            # One per task (at most one per rank) and a few waiting: past those, the ranks' own
            # connections and a crowd of waiting ones may be refused.
            required_connections=max(1, world_size) + 2 * CONNECTION_SLACK,
            name="sparktrain-channel",
            room=inbox.room,
        )
        inbox.server = self

    def __enter__(self) -> ChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
