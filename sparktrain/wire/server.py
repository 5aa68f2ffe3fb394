"""One authenticated frame server: the driver's channel and an MPI task's peer server.

Every connection starts with the server's nonce; the peer then has :data:`AUTH_TIMEOUT`
seconds, counted once from the connection (not restarted by each byte), to send a first frame
of at most :data:`AUTH_FRAME_MAX` bytes that authenticates: the server reads no more than that
frame's header before it has checked the length, and parses nothing before the HMAC checks
out. Only an authenticated connection may send larger frames (up to
:data:`~sparktrain.wire.frames.MAX_FRAME`), and each of its frames must arrive whole within
:data:`FRAME_TIMEOUT` of its first byte; between frames it may stay quiet for as long as it
likes.

One thread serves every connection: a selector (epoll where there is one) accepts, reads and
writes non-blocking sockets, so threads do not grow with connections. Sends never block it:
:meth:`FrameServer.send` writes what the socket takes at once and queues the rest (at most
:data:`MAX_OUTBOX` bytes per connection), which the loop writes as the peer reads; a peer that
reads nothing for :data:`FRAME_TIMEOUT` while data waits for it, or lets more than that pile
up, is dropped. The callbacks run on that thread, so they must return quickly and never wait
on the network.

Connections are bounded: at most ``max_pending`` may be waiting to authenticate (who makes
room for a new one: :mod:`~sparktrain.wire.waiting`) and at most ``max_connections`` may be
authenticated; each needs a file descriptor, so the server raises the process's soft
``RLIMIT_NOFILE`` toward its hard limit when the two need it, and refuses to start, naming
the limit, when they cannot be had. A connection that authenticated is never dropped to make
room, and the server answers its first frame at once (:data:`~sparktrain.wire.frames.AUTH`),
so a peer knows it was admitted, and one dropped before that connects again
(:class:`~sparktrain.wire.frames.ChannelClient`): a flood of keyless connections cannot lock
the ranks out. Connections that end without authenticating are counted and logged
(:mod:`~sparktrain.wire.drops`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sparktrain.wire.connection import FD_RESERVE, MAX_OUTBOX, Connection, ensure_fd_limit
from sparktrain.wire.drops import LOG_INTERVAL, DropLog
from sparktrain.wire.frames import (
    MAX_FRAME,
    NONCE_BYTES,
    TO_CLIENT,
    FrameError,
    encode_body,
    seal,
    shutdown,
)
from sparktrain.wire.intake import AUTH_FRAME_MAX, AUTH_TIMEOUT, FRAME_TIMEOUT, Intake
from sparktrain.wire.waiting import WaitingRoom

_log = logging.getLogger("sparktrain.wire")

OnMessage = Callable[[int, dict[str, Any]], None]
OnClosed = Callable[[int], None]


class FrameServer(Intake):
    """A TCP server speaking authenticated frames on non-blocking sockets, from one thread.

    Args:
        key: the run's HMAC key.
        on_message: called (on the server's thread) with each authenticated message.
        on_closed: called once when an authenticated connection ends (not after :meth:`close`).
        bind: address to listen on (``""`` for every IPv4 interface); see
            :func:`~sparktrain.wire.address.listen_address`.
        advertise: the host name or address peers should connect to (default: ``bind``).
        max_connections: most authenticated connections at once; more are refused.
        max_pending: most connections waiting to authenticate; beyond it, the oldest makes
            room, once what it sent has been read.
        name: names the thread, and the server in log messages.
        room: whether the consumer takes more messages now; after a delivery while it says
            no, that connection is not read until :meth:`resume` (its peer's sends wait in
            TCP), so a fast sender cannot fill the consumer's memory.
        required_connections: how many connections (authenticated or waiting) the server
            cannot do without (default: all it may hold); a file limit that allows these but
            not all is only warned about.

    Raises:
        ConfigurationError: the process cannot open enough files for ``max_connections``.
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
        room: Callable[[], bool] | None = None,
        required_connections: int | None = None,
    ) -> None:
        ensure_fd_limit(max_connections + max_pending, required_connections)
        self.key = key
        self.drops = DropLog(name)
        self.name = name
        self.max_connections = max_connections
        self.max_pending = max_pending
        self._on_message = on_message
        self._on_closed = on_closed
        self._room = room
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        backlog = min(4096, max(128, max_connections))
        self._sock = socket.create_server((bind.strip("[]"), 0), family=family, backlog=backlog)
        self._sock.setblocking(False)
        self._advertise = advertise or bind or "127.0.0.1"
        self._conns: dict[int, Connection] = {}
        self._waiting = WaitingRoom(max_pending)
        self._authenticated = 0
        self._paused: set[int] = set()
        self._frame_deadlines: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._last_sweep = 0.0
        # Work handed to the loop by other threads: ("write" | "drop" | "slow" | "resume", id).
        self._todo: collections.deque[tuple[str, int]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # Kept to be let go when the process runs out of descriptors, to refuse one cleanly.
        self._spare: int | None = os.open(os.devnull, os.O_RDONLY)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def rejected(self) -> int:
        """Connections dropped: failed authentication or framing, too slow, over the limits."""
        return self.drops.dropped

    @property
    def abandoned(self) -> int:
        """Connections their peer closed before they authenticated."""
        return self.drops.left

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._sock.getsockname()[1])

    @property
    def address(self) -> str:
        """``host:port`` that peers connect to."""
        return f"{self._advertise}:{self.port}"

    # -- any thread -----------------------------------------------------------------------

    def send(self, conn_id: int, message: dict[str, Any]) -> bool:
        """Queue a message for one authenticated connection, without waiting for the peer.

        Returns:
            False if the connection is gone (or never proved itself, or is too far behind),
            or the message is too large for a frame.
        """
        try:
            body = encode_body(message)
        except FrameError:
            return False
        return self._send_body(conn_id, body)

    def _send_body(self, conn_id: int, body: bytes) -> bool:
        with self._lock:
            conn = self._conns.get(conn_id)
        if conn is None or not conn.authenticated or conn.closed:
            return False
        with conn.lock:
            frame = memoryview(seal(self.key, conn.nonce, TO_CLIENT, conn.send_seq, body))
            conn.send_seq += 1
            sent = conn.queue(frame)
        if sent is None:
            if conn.out_bytes + len(frame) > MAX_OUTBOX:
                self._post("slow", conn.id)
            return False
        if not sent:
            self._post("write", conn.id)
        return True

    def broadcast(self, message: dict[str, Any], conn_ids: list[int]) -> None:
        """Send to several connections, ignoring those that are gone (the message is
        encoded once; only its HMAC differs from one connection to the next)."""
        try:
            body = encode_body(message)
        except FrameError as exc:
            # Not a peer's fault, and no peer will hear of it: say so where it is seen.
            _log.error("%s: %r message not sent to anyone: %s", self.name, message.get("type"), exc)
            return
        for conn_id in conn_ids:
            self._send_body(conn_id, body)

    def drop(self, conn_id: int) -> None:
        """Close one connection (its peer sees EOF)."""
        self._post("drop", conn_id)

    def resume(self) -> None:
        """The consumer has room again: read the connections paused for it."""
        self._post("resume", 0)

    def close(self) -> None:
        """Stop accepting, drop every connection and end the server's thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(10)

    def _post(self, action: str, conn_id: int) -> None:
        self._todo.append((action, conn_id))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    # -- the server's thread ----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._closed:
                accept = False
                for key, mask in self._sel.select(self._timeout()):
                    if key.data == "accept":
                        accept = True  # after the reads: a pending peer's frame comes first
                    elif key.data == "wake":
                        self._drain_todo()
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_WRITE and not conn.closed:
                            self._flush(conn)
                        if mask & selectors.EVENT_READ and not conn.closed:
                            self._read(conn)
                if accept:
                    self._accept()
                self._expire(time.monotonic())
        finally:
            for conn in list(self._conns.values()):
                self._close(conn, notify=False)
            self.drops.flush(time.monotonic(), last=True)
            self._sel.close()
            for sock in (self._sock, self._wake_r, self._wake_w):
                sock.close()
            if self._spare is not None:
                os.close(self._spare)

    def _drain_todo(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        while self._todo:
            action, conn_id = self._todo.popleft()
            if action == "resume":
                # Taken first: a connection may fill the consumer again and pause anew.
                resumed, self._paused = self._paused, set()
                for paused in [self._conns.get(i) for i in resumed]:
                    if paused is not None and not paused.closed:
                        paused.paused = False
                        self._watch(paused)
                        self._parse(paused)
                continue
            conn = self._conns.get(conn_id)
            if conn is None or conn.closed:
                continue
            if action == "write":
                self._watch(conn)
            else:
                if action == "slow":
                    self._reject(f"more than {MAX_OUTBOX} bytes sent to it waited unread")
                self._close(conn)

    def _accept(self) -> None:
        for _ in range(256):  # then let the other connections have a turn
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                self._out_of_files(exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Before its nonce: a peer that has one holds a place.
            self._waiting.make_room(self._read, self._make_room_drop)
            conn = Connection(next(self._ids), sock)
            try:
                sent = sock.send(conn.nonce)  # a fresh socket's buffer takes 16 bytes
            except OSError:
                sent = 0  # reset by its peer already
            if sent != NONCE_BYTES:
                self.drops.gone()
                sock.close()
                continue
            with self._lock:
                self._conns[conn.id] = conn
            self._waiting.add(conn)
            self._watch(conn)

    def _make_room_drop(self, conn: Connection) -> None:
        self._reject("did not authenticate before newer connections needed room")
        self._close(conn)

    def _out_of_files(self, exc: OSError) -> None:
        """accept() failed (usually EMFILE): refuse the waiting connection rather than spin."""
        if self._spare is None:
            return
        os.close(self._spare)
        try:
            sock, _ = self._sock.accept()
            sock.close()
        except OSError:
            pass
        self._spare = os.open(os.devnull, os.O_RDONLY)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._reject(f"out of file descriptors ({exc}; RLIMIT_NOFILE soft limit {soft})")

    def _watch(self, conn: Connection) -> None:
        """Have the selector watch for what ``conn`` needs now."""
        events = 0 if conn.paused else selectors.EVENT_READ
        if conn.out:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _flush(self, conn: Connection) -> None:
        conn.flush()
        self._watch(conn)

    def _close(self, conn: Connection, notify: bool = True) -> None:
        if conn.closed:
            return
        with conn.lock:
            conn.closed = True
            conn.out.clear()
        with self._lock:
            self._conns.pop(conn.id, None)
        self._waiting.remove(conn)
        self._paused.discard(conn.id)
        if conn.events:
            self._sel.unregister(conn.sock)
        shutdown(conn.sock)
        conn.sock.close()
        if conn.authenticated:
            self._authenticated -= 1
            if notify and not self._closed and self._on_closed is not None:
                self._deliver(self._on_closed, conn.id)

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        """Run a callback; its failure is logged, and never ends the server's thread."""
        try:
            callback(*args)
        except Exception:  # noqa: BLE001 - one bad callback must not stop every connection
            _log.exception("%s: a message handler failed", self.name)


__all__ = [
    "AUTH_FRAME_MAX",
    "FD_RESERVE",
    "AUTH_TIMEOUT",
    "FRAME_TIMEOUT",
    "LOG_INTERVAL",
    "MAX_FRAME",
    "MAX_OUTBOX",
    "FrameServer",
    "ensure_fd_limit",
]
