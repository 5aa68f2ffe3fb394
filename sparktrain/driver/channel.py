"""The driver's authenticated service: tasks report logs, progress and failures here.

Messages are put on one queue as ``(connection id, message)``; the run's monitor is the only
consumer. The frames, their authentication and the bounds on connections are
:class:`~sparktrain.wire.server.FrameServer`'s; a connection that sends anything
unauthenticated or oversized is dropped and counted in :attr:`ChannelServer.rejected`.
"""

from __future__ import annotations

import queue
from typing import Any

from sparktrain.wire.server import FrameServer

CLOSED = "_closed"


class ChannelServer(FrameServer):
    """A TCP server for one run; its messages arrive on :attr:`events`.

    Args:
        key: the run's HMAC key.
        bind: address to listen on (``127.0.0.1`` for local runs, ``0.0.0.0`` for clusters).
        advertise: the host name or address tasks should connect to.
    """

    def __init__(self, key: bytes, bind: str = "127.0.0.1", advertise: str | None = None) -> None:
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        super().__init__(
            key,
            lambda conn_id, message: self.events.put((conn_id, message)),
            lambda conn_id: self.events.put((conn_id, {"type": CLOSED})),
            bind=bind,
            advertise=advertise,
            name="sparktrain-channel",
        )

    def __enter__(self) -> ChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
