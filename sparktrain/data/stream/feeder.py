"""Task side: hand a partition's Arrow record batches to the task's local ranks as they come.

Batch ``i`` of the partition goes to local rank ``i % k`` (round-robin by batch, so which rank
gets which rows depends only on the partition's batches, not on timing). Each rank's
connection carries at most ``window`` batches that the rank has not yet taken (credit-based
flow control: the rank returns one credit byte per batch it takes), so the feeder blocks on the
slowest rank and never holds more than the batch in hand, whatever the partition's size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType

import pyarrow as pa

from sparktrain import locked_dirs, private_dir
from sparktrain.data.stream import protocol
from sparktrain.data.stream.protocol import StreamError

STREAMS = "streams"
PREFIX = "feed-"
SOCKET_NAME = "feed.sock"
_HANDSHAKE_TIMEOUT = 30.0


@dataclasses.dataclass
class FeedStats:
    """What one :meth:`Feeder.feed` sent.

    Attributes:
        batches: batches sent to each local rank.
        rows: rows sent to each local rank.
        max_unread: the most batches any rank held unread (never above the window).
    """

    batches: list[int]
    rows: list[int]
    max_unread: int = 0


class Feeder:
    """A Unix socket in a private folder that the task's ``k`` local ranks connect to.

    Use as a context manager: the folder and socket exist inside the block, and are removed
    when it ends, whatever happened. The socket's folder is made with ``mkdtemp`` (0700) inside
    this user's private folder (:mod:`sparktrain.private_dir`), so no other account can reach
    the socket; each connection must also prove the run's key (:mod:`.protocol`).

    Args:
        ranks: the number of local ranks that will connect (``k``).
        key: the run's key.
        parent: where the private folder lives (default: the temporary folder).
        window: batches a rank may hold unread before the feeder waits for it.
        accept_timeout: seconds to wait for all ranks to connect.
        names: how errors name each local rank (default ``local rank i``).
        on_wait: called with the local index each time the feeder blocks for that rank.
    """

    def __init__(
        self,
        ranks: int,
        key: bytes,
        parent: str | Path | None = None,
        window: int = 2,
        accept_timeout: float = 120.0,
        names: Sequence[str] | None = None,
        on_wait: Callable[[int], None] | None = None,
    ) -> None:
        if ranks < 1 or window < 1:
            raise ValueError(f"ranks and window must be >= 1, not {ranks} and {window}")
        self.ranks = ranks
        self.window = window
        self._key = key
        self._parent = parent
        self._accept_timeout = accept_timeout
        self._names = (
            list(names) if names is not None else [f"local rank {i}" for i in range(ranks)]
        )
        self._on_wait = on_wait
        self._folder: Path | None = None
        self._lock = -1
        self._server: socket.socket | None = None
        self._conns: list[socket.socket | None] = [None] * ranks
        self.unread = [0] * ranks

    @property
    def folder(self) -> Path:
        """The private folder holding the socket (only inside the block)."""
        if self._folder is None:
            raise StreamError("the feeder is not open: use it in a with block")
        return self._folder

    @property
    def address(self) -> str:
        """The socket's path, for the ranks (see :class:`RankStream`)."""
        return str(self.folder / SOCKET_NAME)

    def __enter__(self) -> Feeder:
        base = private_dir.usable_folder(STREAMS, self._parent)
        locked_dirs.sweep(base, PREFIX, "stream folders")
        self._folder, self._lock = locked_dirs.make_locked(base, PREFIX)
        try:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server = server
            with protocol.reachable(self.address) as name:
                server.bind(name)
            server.listen(self.ranks)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def stop(self) -> None:
        """Wake a :meth:`feed` blocked in another thread (waiting for a rank to connect or to
        take a batch): it then ends with an error. Close afterwards, once that thread ended."""
        for sock in [*self._conns, self._server]:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close every connection and remove the folder (idempotent)."""
        for i, conn in enumerate(self._conns):
            if conn is not None:
                conn.close()
                self._conns[i] = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def feed(self, batches: Iterable[pa.RecordBatch]) -> FeedStats:
        """Accept the ranks, send them ``batches`` round-robin, then the end of the stream.

        Raises:
            StreamError: a rank did not connect in time, or stopped reading (it exited or
                was killed); the other ranks are told, so they stop instead of waiting.
            Exception: whatever ``batches`` raised, after the ranks were told its message.
        """
        stats = FeedStats([0] * self.ranks, [0] * self.ranks)
        schemas: list[pa.Schema | None] = [None] * self.ranks
        index = 0
        try:
            self._accept_all()
            for batch in batches:
                rank = index % self.ranks
                index += 1
                self._await_credit(rank)
                if schemas[rank] is None or not batch.schema.equals(schemas[rank]):
                    self._send(rank, protocol.SCHEMA, batch.schema.serialize())
                    schemas[rank] = batch.schema
                self._send(rank, protocol.BATCH, batch.serialize())
                self.unread[rank] += 1
                stats.max_unread = max(stats.max_unread, self.unread[rank])
                stats.batches[rank] += 1
                stats.rows[rank] += batch.num_rows
            for rank in range(self.ranks):
                self._send(rank, protocol.END)
        except StreamError as exc:
            self._tell_all(str(exc))
            raise
        except Exception as exc:
            self._tell_all(f"the task's input failed: {type(exc).__name__}: {exc}")
            raise
        return stats

    def _accept_all(self) -> None:
        server = self._server
        if server is None:
            raise StreamError("the feeder is not open: use it in a with block")
        deadline = time.monotonic() + self._accept_timeout
        while any(conn is None for conn in self._conns):
            try:
                # One deadline for all: a stray connection does not extend the wait.
                server.settimeout(max(0.0, deadline - time.monotonic()))
                conn, _ = server.accept()
            except (TimeoutError, BlockingIOError) as exc:
                missing = [self._names[i] for i, c in enumerate(self._conns) if c is None]
                raise StreamError(
                    f"{', '.join(missing)} did not connect to the task's stream within "
                    f"{self._accept_timeout:g} s; a rank must open its loader to take its rows"
                ) from exc
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        conn.settimeout(_HANDSHAKE_TIMEOUT)
        try:
            _check_peer(conn)
            index = protocol.greet_rank(conn, self._key)
        except (OSError, EOFError, StreamError, struct.error):
            conn.close()  # not one of ours (or gone): the ranks' own connections decide
            return
        if index >= self.ranks or self._conns[index] is not None:
            conn.close()
            raise StreamError(
                f"a process with the run's key connected as local index {index}, which is out "
                f"of range or taken (this task has {self.ranks} local ranks)"
            )
        conn.settimeout(None)
        self._conns[index] = conn

    def _await_credit(self, rank: int) -> None:
        conn = self._conn(rank)
        while self.unread[rank] >= self.window:
            if self._on_wait is not None:
                self._on_wait(rank)
            try:
                got = conn.recv(4096)
            except OSError as exc:
                raise self._gone(rank, exc) from exc
            if not got:
                raise self._gone(rank, None)
            # Never below zero: a peer's extra credits cannot buy it an unbounded stream.
            self.unread[rank] = max(0, self.unread[rank] - got.count(protocol.CREDIT))

    def _send(self, rank: int, kind: bytes, payload: pa.Buffer | bytes = b"") -> None:
        try:
            protocol.send_frame(self._conn(rank), kind, memoryview(payload))
        except OSError as exc:
            raise self._gone(rank, exc) from exc

    def _conn(self, rank: int) -> socket.socket:
        conn = self._conns[rank]
        if conn is None:
            raise StreamError(f"{self._names[rank]} is not connected")
        return conn

    def _gone(self, rank: int, exc: OSError | None) -> StreamError:
        conn = self._conns[rank]
        if conn is not None:
            conn.close()
            self._conns[rank] = None
        why = f" ({exc})" if exc is not None else ""
        return StreamError(
            f"{self._names[rank]} stopped reading the task's stream{why}: its process "
            f"exited or was killed; see its own error for the cause"
        )

    def _tell_all(self, message: str) -> None:
        for rank, conn in enumerate(self._conns):
            if conn is None:
                continue
            try:
                protocol.send_frame(conn, protocol.FAIL, message.encode("utf-8", "replace"))
            except OSError:
                pass  # that rank is gone too; its own connection says so
            conn.close()
            self._conns[rank] = None


def _check_peer(conn: socket.socket) -> None:
    """Refuse a peer of another uid, where the kernel says (Linux ``SO_PEERCRED``)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, 12))
    if uid != os.getuid():
        raise StreamError(f"a process of uid {uid} connected to the stream's socket")
