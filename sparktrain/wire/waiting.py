"""The connections a frame server holds while they have not authenticated, and which of them
makes room for a new one.

A flood of keyless connections fills this room in an instant, so who is dropped decides
whether a task's connection, made in the middle of it, gets through: what the oldest have sent
is read first (a peer whose frame has arrived authenticates then, one that hung up is closed),
and only then is one dropped, the oldest that has sent nothing before any that has sent.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from sparktrain.wire.connection import Connection


class WaitingRoom:
    """Connections waiting to authenticate, oldest first, and which of them sent nothing yet.

    Args:
        size: most connections that may wait at once.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._all: collections.OrderedDict[int, Connection] = collections.OrderedDict()
        self._silent: collections.OrderedDict[int, Connection] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._all)

    def add(self, conn: Connection) -> None:
        """A new connection, that has sent nothing yet."""
        self._all[conn.id] = conn
        self._silent[conn.id] = conn

    def heard(self, conn: Connection) -> None:
        """``conn`` has sent something."""
        self._silent.pop(conn.id, None)

    def remove(self, conn: Connection) -> None:
        """``conn`` no longer waits (it authenticated, or is closed)."""
        self._all.pop(conn.id, None)
        self._silent.pop(conn.id, None)

    def oldest(self) -> Connection | None:
        """The connection that has waited longest, if any waits."""
        return next(iter(self._all.values()), None)

    def make_room(
        self, read: Callable[[Connection], None], drop: Callable[[Connection], None]
    ) -> None:
        """Bring the room below :attr:`size`, for one more connection.

        Args:
            read: reads what a connection has sent (it may authenticate or close it, either
                of which takes it out of the room through :meth:`remove`, or mark it heard).
            drop: drops a connection (and takes it out of the room).

        Each turn takes a connection out or moves one out of the silent ones, so this ends.
        """
        while len(self._all) >= self.size:
            oldest = next(iter((self._silent or self._all).values()))
            was_silent = oldest.id in self._silent
            read(oldest)
            if oldest.id not in self._all:
                continue  # it authenticated, or it was gone
            if was_silent and oldest.id not in self._silent:
                continue  # it has just begun to send: an older silent one goes first
            drop(oldest)
