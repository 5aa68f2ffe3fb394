"""How a connection's bytes become messages, and the deadlines that hold a peer to it.

The input half of :class:`~sparktrain.wire.server.FrameServer` (which see for the whole
policy): before a connection has authenticated, nothing past its first frame's header is read
until the length is checked against :data:`AUTH_FRAME_MAX`, and nothing is parsed before its
HMAC checks out; the first good frame admits it (if there is room) and is answered at once.
After that, each frame must arrive whole within :data:`FRAME_TIMEOUT` of its first byte, and a
peer that leaves what is sent to it unread for as long is dropped.

Everything here runs on the server's one thread.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from sparktrain.wire import protocol
from sparktrain.wire.connection import Connection
from sparktrain.wire.drops import DropLog
from sparktrain.wire.frames import (
    AUTH,
    HEADER_BYTES,
    MAC_BYTES,
    MAX_FRAME,
    REFUSED,
    TO_SERVER,
    FrameError,
    encode_body,
    frame_length,
    open_frame,
)
from sparktrain.wire.waiting import WaitingRoom

AUTH_TIMEOUT = 10.0
AUTH_FRAME_MAX = 4096
FRAME_TIMEOUT = 60.0
_READ_CHUNK = 1 << 16
# The server's answer to a connection's first frame: it was admitted.
_WELCOME = encode_body({"type": AUTH})


class Intake:
    """Reading, framing, admission and expiry, for the server that owns the connections.

    The server provides the state below and the methods that act on a connection (watch it,
    close it, queue a frame to it, run a callback).
    """

    key: bytes
    drops: DropLog
    max_connections: int
    _conns: dict[int, Connection]
    _waiting: WaitingRoom
    _authenticated: int
    _paused: set[int]
    _frame_deadlines: list[tuple[float, int]]
    _last_sweep: float
    _on_message: Callable[[int, dict[str, Any]], None]
    _room: Callable[[], bool] | None

    def _watch(self, conn: Connection) -> None:
        raise NotImplementedError

    def _close(self, conn: Connection, notify: bool = True) -> None:
        raise NotImplementedError

    def _send_body(self, conn_id: int, body: bytes) -> bool:
        raise NotImplementedError

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        raise NotImplementedError

    def _reject(self, why: str) -> None:
        self.drops.drop(why)

    def _timeout(self) -> float:
        """Seconds until the next deadline the loop must act on (at most one)."""
        now = time.monotonic()
        soonest = now + 1.0  # the sweep for stuck sends
        oldest = self._waiting.oldest()
        if oldest is not None:
            soonest = min(soonest, oldest.opened + AUTH_TIMEOUT)
        if self._frame_deadlines:
            soonest = min(soonest, self._frame_deadlines[0][0])
        due = self.drops.due()
        if due is not None:
            soonest = min(soonest, due)
        return max(0.0, soonest - now)

    def _read(self, conn: Connection) -> None:
        """Read what ``conn`` has sent: one chunk once it is authenticated; before that, as
        far as its first frame (its header first, then as much as the header announced)."""
        while True:
            if conn.authenticated:
                want = _READ_CHUNK
            elif len(conn.buf) < HEADER_BYTES:
                want = HEADER_BYTES - len(conn.buf)  # not a byte more before the length is checked
            else:
                # _parse has checked this header's length against AUTH_FRAME_MAX.
                length = int.from_bytes(conn.buf[4:HEADER_BYTES], "big")
                want = HEADER_BYTES + MAC_BYTES + length - len(conn.buf)
            try:
                data = conn.sock.recv(want)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                if not conn.authenticated:
                    self.drops.gone()
                self._close(conn)  # EOF (a half-sent frame is not an attack)
                return
            conn.buf += data
            self._parse(conn)
            if conn.closed or conn.authenticated or len(data) < want:
                return

    def _frame_started(self, conn: Connection) -> None:
        conn.frame_deadline = time.monotonic() + FRAME_TIMEOUT
        heapq.heappush(self._frame_deadlines, (conn.frame_deadline, conn.id))

    def _parse(self, conn: Connection) -> None:
        """Deliver every whole frame in ``conn``'s buffer (until the consumer is full)."""
        buf, at = conn.buf, 0
        try:
            while not conn.paused and len(buf) - at >= HEADER_BYTES:
                limit = MAX_FRAME if conn.authenticated else AUTH_FRAME_MAX
                length = frame_length(bytes(buf[at : at + HEADER_BYTES]), limit)
                end = at + HEADER_BYTES + MAC_BYTES + length
                if len(buf) < end:
                    break
                mac = bytes(buf[at + HEADER_BYTES : at + HEADER_BYTES + MAC_BYTES])
                body = bytes(buf[at + HEADER_BYTES + MAC_BYTES : end])
                message = open_frame(self.key, conn.nonce, TO_SERVER, conn.recv_seq, mac, body)
                conn.recv_seq += 1
                at = end
                first = not conn.authenticated
                if first and not self._authenticate(conn):
                    return
                if first and message.get("type") == protocol.AUTH:
                    continue  # it proved the key; there is nothing to deliver
                self._deliver(self._on_message, conn.id, message)
                if self._room is not None and not self._room():
                    conn.paused = True
                    self._paused.add(conn.id)
                    self._watch(conn)
        except FrameError as exc:
            self._reject(str(exc))
            if not conn.authenticated:
                try:
                    conn.sock.send(REFUSED)  # so a client with the wrong key does not retry
                except OSError:
                    pass
            self._close(conn)
            return
        del buf[:at]
        if not buf or conn.paused or not conn.authenticated:
            # Between frames, or waiting on the consumer (not the sender's fault), or still
            # held to the authentication deadline.
            conn.frame_deadline = None
        elif at or conn.frame_deadline is None:
            self._frame_started(conn)  # a new frame has begun

    def _authenticate(self, conn: Connection) -> bool:
        """``conn``'s first frame checked out: admit it, if there is room."""
        self._waiting.remove(conn)
        if self._authenticated >= self.max_connections:
            self._reject(f"more than {self.max_connections} authenticated connections")
            self._close(conn)
            return False
        conn.authenticated = True
        self._authenticated += 1
        self._send_body(conn.id, _WELCOME)  # its peer now knows it was admitted
        return True

    def _expire(self, now: float) -> None:
        self.drops.flush(now)
        while (oldest := self._waiting.oldest()) is not None:
            if oldest.opened + AUTH_TIMEOUT > now:
                break
            self._reject("no authenticated frame in time")
            self._close(oldest)
        while self._frame_deadlines and self._frame_deadlines[0][0] <= now:
            deadline, conn_id = heapq.heappop(self._frame_deadlines)
            conn = self._conns.get(conn_id)
            if conn is not None and conn.frame_deadline == deadline:
                self._reject(f"a frame did not arrive whole within {FRAME_TIMEOUT:g}s")
                self._close(conn)
        if now - self._last_sweep >= 1.0:
            self._last_sweep = now
            for conn in [c for c in self._conns.values() if c.out]:
                if now - conn.out_since > FRAME_TIMEOUT:
                    self._reject(f"read nothing sent to it for {FRAME_TIMEOUT:g}s")
                    self._close(conn)
