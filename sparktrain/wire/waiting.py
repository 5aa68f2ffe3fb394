"""The connections a frame server holds while they have not authenticated, and which of them
makes room for a new one.

A flood of keyless connections fills this room in an instant, so who is dropped decides
whether a task's connection, made in the middle of it, gets through. What the oldest has sent
is read first (a peer whose frame has arrived authenticates then, one that hung up is closed);
only then is it dropped. The oldest goes first whatever it sent: preferring to drop the silent
ones would let a stranger that sends one byte push a task's connection, silent until its
first frame arrives, out at the next connection; oldest first leaves every new connection the
time the server takes to accept ``size`` more.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from sparktrain.wire.connection import Connection


class WaitingRoom:
    """Connections waiting to authenticate, oldest first.

    Args:
        size: most connections that may wait at once.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._all: collections.OrderedDict[int, Connection] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._all)

    def add(self, conn: Connection) -> None:
        """A new connection."""
        self._all[conn.id] = conn

    def remove(self, conn: Connection) -> None:
        """``conn`` no longer waits (it authenticated, or is closed)."""
        self._all.pop(conn.id, None)

    def oldest(self) -> Connection | None:
        """The connection that has waited longest, if any waits."""
        return next(iter(self._all.values()), None)

    def make_room(
        self, read: Callable[[Connection], None], drop: Callable[[Connection], None]
    ) -> None:
        """Bring the room below :attr:`size`, for one more connection.

        Args:
            read: reads what a connection has sent; it may authenticate or close it, either
                of which takes it out of the room through :meth:`remove`.
            drop: drops a connection (and takes it out of the room through :meth:`remove`).
        """
        while len(self._all) >= self.size:
            oldest = next(iter(self._all.values()))
            read(oldest)
            if oldest.id in self._all:
                drop(oldest)
                self._all.pop(oldest.id, None)  # out, however ``drop`` went
