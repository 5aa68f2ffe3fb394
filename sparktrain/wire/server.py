"""One authenticated frame server: the driver's channel and an MPI task's peer server.

Every connection starts with the server's nonce; the peer then has :data:`AUTH_TIMEOUT`
seconds, counted once from the connection (not restarted by each byte), to send a first frame
of at most :data:`AUTH_FRAME_MAX` bytes that authenticates. Only an authenticated connection
may send larger frames (up to :data:`~sparktrain.wire.frames.MAX_FRAME`), and each of its
frames must arrive whole within :data:`FRAME_TIMEOUT` of its first byte; between frames it may
stay quiet for as long as it likes.

Connections are bounded: at most ``max_pending`` may be waiting to authenticate (the oldest is
dropped to make room for a new one, so a flood cannot lock the ranks out) and at most
``max_connections`` may be authenticated. There is one thread per connection, and the
acceptor starts a new one only while fewer than ``max_pending + max_connections`` run (a
dropped connection's thread may take a moment to end), so threads are bounded by the two
whatever the flood. Rejected connections (failed, late or dropped to make room) are counted
and logged, at most once per :data:`LOG_INTERVAL` seconds.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sparktrain.wire import protocol
from sparktrain.wire.frames import (
    MAX_FRAME,
    NONCE_BYTES,
    TO_CLIENT,
    TO_SERVER,
    FrameError,
    encode,
    read_frame,
    shutdown,
)

AUTH_TIMEOUT = 10.0
AUTH_FRAME_MAX = 4096
FRAME_TIMEOUT = 60.0
LOG_INTERVAL = 10.0

_log = logging.getLogger("sparktrain.wire")

OnMessage = Callable[[int, dict[str, Any]], None]
OnClosed = Callable[[int], None]


class _Connection:
    def __init__(self, conn_id: int, sock: socket.socket) -> None:
        self.id = conn_id
        self.sock = sock
        self.nonce = os.urandom(NONCE_BYTES)
        self.send_seq = 0
        self.lock = threading.Lock()
        self.authenticated = False
        # Dropped to make room for a newer connection; it may no longer authenticate.
        self.evicted = False
        self.opened = time.monotonic()

    def shutdown(self) -> None:
        shutdown(self.sock)


class FrameServer:
    """A TCP server speaking authenticated frames, with one thread per (bounded) connection.

    Args:
        key: the run's HMAC key.
        on_message: called from the connection's thread with each authenticated message.
        on_closed: called once when an authenticated connection ends (not after :meth:`close`).
        bind: address to listen on (``""`` for every IPv4 interface); see
            :func:`~sparktrain.wire.address.listen_address`.
        advertise: the host name or address peers should connect to (default: ``bind``).
        max_connections: most authenticated connections at once; more are refused.
        max_pending: most connections waiting to authenticate; the oldest makes room.
        name: names the threads, and the server in log messages.
    """

    def __init__(
        self,
        key: bytes,
        on_message: OnMessage,
        on_closed: OnClosed | None = None,
        *,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
        max_connections: int = 256,
        max_pending: int = 64,
        name: str = "sparktrain-frames",
    ) -> None:
        self.key = key
        self.rejected = 0
        self.name = name
        self.max_connections = max_connections
        self.max_pending = max_pending
        self._on_message = on_message
        self._on_closed = on_closed
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._sock = socket.create_server((bind.strip("[]"), 0), family=family, backlog=128)
        self._advertise = advertise or bind or "127.0.0.1"
        self._conns: dict[int, _Connection] = {}
        self._lock = threading.Lock()
        # Signalled when a connection's thread ends (or the server closes): room for another.
        self._room = threading.Condition(self._lock)
        self._threads = 0
        self._ids = itertools.count(1)
        self._closed = False
        self._last_log = 0.0
        self._unlogged = 0
        self._acceptor = threading.Thread(target=self._accept, name=name, daemon=True)
        self._acceptor.start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._sock.getsockname()[1])

    @property
    def address(self) -> str:
        """``host:port`` that peers connect to."""
        return f"{self._advertise}:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            conn = _Connection(next(self._ids), sock)
            with self._lock:
                pending = sorted(
                    (c for c in self._conns.values() if not c.authenticated and not c.evicted),
                    key=lambda c: c.opened,
                )
                evict = pending[: max(0, len(pending) - self.max_pending + 1)]
                for old in evict:
                    old.evicted = True
            for old in evict:
                old.shutdown()
                self._reject("did not authenticate before newer connections needed room")
            if not self._admit(conn):
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), name=self.name, daemon=True)
            try:
                thread.start()
            except RuntimeError:  # the process is out of threads: drop this one, keep accepting
                self._release(conn)
                self._reject("no thread to serve it")

    def _admit(self, conn: _Connection) -> bool:
        """Wait for room for one more connection thread; close ``conn`` if none comes in time."""
        limit = self.max_pending + self.max_connections
        with self._room:
            room = self._room.wait_for(
                lambda: self._closed or self._threads < limit, timeout=AUTH_TIMEOUT
            )
            if room and not self._closed:
                self._threads += 1
                self._conns[conn.id] = conn
                return True
        conn.shutdown()
        conn.sock.close()
        if not self._closed:
            self._reject(f"more than {limit} connections")
        return False

    def _release(self, conn: _Connection) -> None:
        """Forget an admitted connection and close it, making room for another."""
        with self._room:
            self._conns.pop(conn.id, None)
            self._threads -= 1
            self._room.notify()
        try:
            conn.sock.close()
        except OSError:
            pass

    def _reject(self, why: str) -> None:
        with self._lock:
            self.rejected += 1
            self._unlogged += 1
            now = time.monotonic()
            if now - self._last_log < LOG_INTERVAL:
                return
            count, self._unlogged, self._last_log = self._unlogged, 0, now
        _log.warning(
            "%s: dropped %d connection(s) that failed authentication or framing, were too "
            "slow, or were over the limits (latest: %s)",
            self.name,
            count,
            why,
        )

    def _authenticate(self, conn: _Connection) -> dict[str, Any] | None:
        """Read the first frame within the deadline; the message to deliver, if any."""
        deadline = conn.opened + AUTH_TIMEOUT
        message = read_frame(
            conn.sock, self.key, conn.nonce, TO_SERVER, 0, limit=AUTH_FRAME_MAX, deadline=deadline
        )
        with self._lock:
            if conn.evicted:
                raise EOFError("dropped to make room")
            authenticated = sum(c.authenticated for c in self._conns.values())
            if authenticated >= self.max_connections:
                raise FrameError(f"more than {self.max_connections} authenticated connections")
            conn.authenticated = True
        conn.sock.settimeout(None)
        return None if message.get("type") == protocol.AUTH else message

    def _serve(self, conn: _Connection) -> None:
        try:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sock.settimeout(AUTH_TIMEOUT)
            conn.sock.sendall(conn.nonce)
            first = self._authenticate(conn)
            if first is not None:
                self._on_message(conn.id, first)
            for seq in itertools.count(1):
                message = read_frame(
                    conn.sock, self.key, conn.nonce, TO_SERVER, seq, frame_timeout=FRAME_TIMEOUT
                )
                self._on_message(conn.id, message)
        except FrameError as exc:
            self._reject(str(exc))
        except TimeoutError:
            if not conn.authenticated:
                self._reject("no authenticated frame in time")
        except (OSError, EOFError):
            pass
        finally:
            self._release(conn)
            if conn.authenticated and not self._closed and self._on_closed is not None:
                self._on_closed(conn.id)

    def send(self, conn_id: int, message: dict[str, Any]) -> bool:
        """Send to one authenticated connection; False if it is gone (or never proved itself)."""
        with self._lock:
            conn = self._conns.get(conn_id)
        if conn is None or not conn.authenticated:
            return False
        try:
            with conn.lock:
                frame = encode(self.key, conn.nonce, TO_CLIENT, conn.send_seq, message)
                conn.send_seq += 1
                conn.sock.sendall(frame)
            return True
        except (OSError, FrameError):
            return False

    def broadcast(self, message: dict[str, Any], conn_ids: list[int]) -> None:
        """Send to several connections, ignoring those that are gone."""
        for conn_id in conn_ids:
            self.send(conn_id, message)

    def drop(self, conn_id: int) -> None:
        """Close one connection (its peer sees EOF)."""
        with self._lock:
            conn = self._conns.get(conn_id)
        if conn is not None:
            conn.shutdown()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        with self._room:
            self._closed = True
            self._room.notify_all()
        # close() alone does not wake a thread blocked in accept(); shutdown() does.
        shutdown(self._sock)
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.shutdown()


__all__ = ["AUTH_FRAME_MAX", "AUTH_TIMEOUT", "FRAME_TIMEOUT", "MAX_FRAME", "FrameServer"]
