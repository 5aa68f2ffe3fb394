"""The listener every task of an MPI run keeps, for mpirun's agent and the run's other tasks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparktrain.wire.server import FrameServer

PeerEvent = Callable[[str, int, Any], None]


class PeerServer(FrameServer):
    """An authenticated listener for the other processes of one MPI run.

    Events are handed to ``on_event(kind, conn_id, message)``: ``("peer", id, message)`` for
    each authenticated frame and ``("peer_closed", id, None)`` when an authenticated
    connection ends. Frames that fail authentication drop the connection.

    Args:
        key: the run's HMAC key.
        on_event: the callback, called from the server's thread (it must not block).
        bind: address to listen on: the task's own host address when it is this machine's
            (see :func:`~sparktrain.wire.address.listen_address`), else ``""`` (every
            interface).
        tasks: the run's number of tasks: each may join, and mpirun's agent connects once
            per host (at most once per task), so twice that (and slack) may authenticate.
    """

    def __init__(self, key: bytes, on_event: PeerEvent, bind: str = "", tasks: int = 64) -> None:
        super().__init__(
            key,
            lambda conn_id, message: on_event("peer", conn_id, message),
            lambda conn_id: on_event("peer_closed", conn_id, None),
            bind=bind,
            max_connections=2 * max(1, tasks) + 64,
            name="sparktrain-peers",
        )
