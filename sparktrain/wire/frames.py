"""Authenticated, bounded frames between tasks / workers and the servers of a run.

A connection starts with the server sending a random nonce. Every frame after that, in both
directions, is ``MAGIC | length (u32) | HMAC-SHA256 | body``; the HMAC covers the run's key,
the nonce, the direction, the frame's sequence number and the body, so a frame cannot be
forged, replayed on another connection or reordered. Lengths over ``MAX_FRAME`` are refused
before anything is read into memory, and bodies are JSON, never pickles. A message may carry
raw bytes under the key :data:`BLOB`: they follow the JSON after a NUL byte (which JSON text
never holds), so bulk data needs no base64 or escaping.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import socket
import struct
import threading
import time
from typing import Any

# The first frame a client sends: small, so a server can authenticate before buffering more.
AUTH = "auth"
MAGIC = b"SPT1"
NONCE_BYTES = 16
MAC_BYTES = 32
MAX_FRAME = 1 << 20
# The one key whose value is raw bytes, sent after the JSON.
BLOB = "blob"
_HEADER = struct.Struct(">4sI")
HEADER_BYTES = _HEADER.size
TO_SERVER = b"C"
TO_CLIENT = b"S"
# What a server sends a peer whose first frame failed (wrong key, bad framing) before it closes
# the connection: not a frame (frames begin with MAGIC), so a client with the wrong key learns
# it at once instead of trying again. A peer dropped to make room gets no such word.
REFUSED = b"\0"
# A client's pauses between attempts to be admitted: the first, and the longest.
RETRY_FIRST = 0.01
RETRY_MOST = 0.5


class FrameError(Exception):
    """A frame was malformed, too large, or failed authentication."""


def new_key() -> bytes:
    """A fresh random key for one run."""
    return os.urandom(32)


def _mac(key: bytes, nonce: bytes, direction: bytes, seq: int, body: bytes) -> bytes:
    return hmac.new(key, nonce + direction + struct.pack(">Q", seq) + body, hashlib.sha256).digest()


def encode_body(message: dict[str, Any]) -> bytes:
    """A message's frame body: JSON (and its :data:`BLOB`, if any, raw after a NUL).

    Raises:
        FrameError: the body would exceed :data:`MAX_FRAME`.
    """
    blob = message.get(BLOB)
    if isinstance(blob, (bytes, bytearray, memoryview)):
        header = {k: v for k, v in message.items() if k != BLOB}
        body = json.dumps(header, separators=(",", ":")).encode() + b"\0" + bytes(blob)
    else:
        body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return body


def seal(key: bytes, nonce: bytes, direction: bytes, seq: int, body: bytes) -> bytes:
    """The frame of an encoded body (see :func:`encode_body`) on one connection."""
    return _HEADER.pack(MAGIC, len(body)) + _mac(key, nonce, direction, seq, body) + body


def encode(key: bytes, nonce: bytes, direction: bytes, seq: int, message: dict[str, Any]) -> bytes:
    """One frame carrying ``message`` as JSON (and its :data:`BLOB`, if any, raw)."""
    return seal(key, nonce, direction, seq, encode_body(message))


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Read exactly ``n`` bytes; EOFError if the peer closes first.

    Args:
        sock: the socket.
        n: how many bytes.
        deadline: a ``time.monotonic()`` by which all of them must have arrived; past it,
            TimeoutError. ``None`` leaves the socket's own timeout in charge.
    """
    chunks = []
    while n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the frame did not arrive in time")
            sock.settimeout(remaining)
        chunk = sock.recv(min(n, 1 << 16))
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(
    sock: socket.socket,
    key: bytes,
    nonce: bytes,
    direction: bytes,
    seq: int,
    *,
    limit: int = MAX_FRAME,
    deadline: float | None = None,
    frame_timeout: float | None = None,
) -> dict[str, Any]:
    """Read and authenticate one frame; the body is parsed only after the HMAC checks out.

    Args:
        sock: the connection.
        key: the run's key.
        nonce: the connection's nonce.
        direction: :data:`TO_SERVER` or :data:`TO_CLIENT`.
        seq: the frame's sequence number in that direction.
        limit: the largest body accepted (at most :data:`MAX_FRAME`).
        deadline: a ``time.monotonic()`` by which the whole frame must have arrived.
        frame_timeout: without ``deadline``: wait for the frame's first byte as long as it
            takes, then give the rest this many seconds.

    Raises:
        EOFError: the peer closed the connection.
        TimeoutError: the frame did not arrive by its deadline.
        FrameError: bad magic, oversized length, bad HMAC or a body that is not a JSON object.
    """
    if deadline is None and frame_timeout is not None:
        sock.settimeout(None)
        first = recv_exact(sock, 1)
        deadline = time.monotonic() + frame_timeout
        header = first + recv_exact(sock, _HEADER.size - 1, deadline)
    else:
        header = recv_exact(sock, _HEADER.size, deadline)
    length = frame_length(header, limit)
    mac = recv_exact(sock, MAC_BYTES, deadline)
    body = recv_exact(sock, length, deadline)
    return open_frame(key, nonce, direction, seq, mac, body)


def frame_length(header: bytes, limit: int = MAX_FRAME) -> int:
    """The body length a frame's header announces, checked before anything more is read.

    Raises:
        FrameError: bad magic, or a length over ``limit`` (or :data:`MAX_FRAME`).
    """
    magic, length = _HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError("bad magic")
    if length > min(limit, MAX_FRAME):
        raise FrameError(f"frame length {length} exceeds {min(limit, MAX_FRAME)}")
    return int(length)


def open_frame(
    key: bytes, nonce: bytes, direction: bytes, seq: int, mac: bytes, body: bytes
) -> dict[str, Any]:
    """Authenticate a frame's body against its HMAC, then (only then) parse it.

    Raises:
        FrameError: bad HMAC, or a body that is not a JSON object.
    """
    if not hmac.compare_digest(mac, _mac(key, nonce, direction, seq, body)):
        raise FrameError("authentication failed")
    text, nul, blob = body.partition(b"\0")
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise FrameError(f"body is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError("body is not a JSON object")
    if nul:
        message[BLOB] = blob
    return message


def shutdown(sock: socket.socket) -> None:
    """End both directions of ``sock`` (waking its blocked readers), if it is still open."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` to a tuple (IPv6 hosts may be bracketed)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class NotReached(ConnectionError):
    """A connection that :class:`ChannelClient`'s ``reach`` gave up on."""


class ChannelClient:
    """A connection to the driver's channel (or another frame server); sending is thread-safe.

    The connection is made when the server has answered its first frame: a server under a
    flood of strangers' connections may drop a new one before its first frame arrives, and
    then it is made again (after a short, growing pause) until ``timeout`` runs out. So
    nothing is sent over a connection the server has not admitted.

    Args:
        address: ``host:port`` of the server.
        key: the run's key.
        timeout: seconds to be admitted in, retries included.
        reach: when set, seconds for the first connection to be made at all: a server not
            reached within them is not retried (a host that drops the connection).

    Raises:
        ConnectionRefusedError: nothing listens at ``address`` (not retried).
        NotReached: with ``reach``, the first connection was not made within it.
        ConnectionError: the server was not reached or did not admit it within ``timeout``,
            or its answer failed authentication (it does not hold the run's key).
    """

    def __init__(
        self, address: str, key: bytes, timeout: float = 30.0, reach: float | None = None
    ) -> None:
        self._key = key
        self._send_seq = 0
        self._recv_seq = 0
        self._lock = threading.Lock()
        self.closed = False
        self._released = False
        self.attempts = 0
        deadline = time.monotonic() + timeout
        pause = RETRY_FIRST
        while True:
            self.attempts += 1
            try:
                first = reach if self.attempts == 1 else None
                self._sock, self._nonce = self._admitted(parse_address(address), deadline, first)
                return
            except ConnectionRefusedError:
                raise
            except NotReached as exc:
                raise NotReached(f"{address} was not reached within {reach:g}s: {exc}") from None
            except FrameError as exc:
                raise ConnectionError(f"{address} failed authentication: {exc}") from None
            except (OSError, EOFError) as exc:
                if time.monotonic() + pause >= deadline:
                    raise ConnectionError(
                        f"{address} did not admit this connection within {timeout:g}s "
                        f"({self.attempts} attempt(s); last: {str(exc) or type(exc).__name__})"
                    ) from None
            time.sleep(pause * random.uniform(0.5, 1.0))  # apart from the others retrying
            pause = min(pause * 2, RETRY_MOST)

    def _admitted(
        self, address: tuple[str, int], deadline: float, reach: float | None = None
    ) -> tuple[socket.socket, bytes]:
        """One connection, once the server has answered its first frame: (socket, nonce)."""
        left = max(0.001, deadline - time.monotonic())
        try:
            sock = socket.create_connection(address, timeout=min(left, reach or left))
        except OSError as exc:
            if reach is None or isinstance(exc, ConnectionRefusedError):
                raise
            raise NotReached(str(exc) or type(exc).__name__) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = recv_exact(sock, NONCE_BYTES, deadline)
            # A small first frame proves the key before the server buffers anything larger.
            sock.sendall(encode(self._key, nonce, TO_SERVER, 0, {"type": AUTH}))
            first = recv_exact(sock, 1, deadline)
            if first == REFUSED:
                raise FrameError("it refused this connection's first frame (not the run's key?)")
            header = first + recv_exact(sock, HEADER_BYTES - 1, deadline)
            length = frame_length(header, 4096)
            mac = recv_exact(sock, MAC_BYTES, deadline)
            body = recv_exact(sock, length, deadline)
            answer = open_frame(self._key, nonce, TO_CLIENT, 0, mac, body)
            if answer.get("type") != AUTH:
                raise FrameError(f"the server's first frame is {answer.get('type')!r}")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        self._send_seq = self._recv_seq = 1
        return sock, nonce

    def send(self, message: dict[str, Any]) -> None:
        """Send one message; raises OSError if the connection is gone or closed here."""
        if self.closed:
            raise OSError("this connection was closed")
        with self._lock:
            frame = encode(self._key, self._nonce, TO_SERVER, self._send_seq, message)
            self._send_seq += 1
            self._sock.sendall(frame)

    def receive(self) -> dict[str, Any]:
        """Block for the next message from the driver (one reader thread only)."""
        message = read_frame(self._sock, self._key, self._nonce, TO_CLIENT, self._recv_seq)
        self._recv_seq += 1
        return message

    def fileno(self) -> int:
        """The connection's file descriptor (for a child process to hold, see :meth:`stop`)."""
        return self._sock.fileno()

    def stop(self) -> None:
        """Send no more on it, and let a reader's error end it quietly, but leave the
        connection open: a child process given a copy of it holds it until the server closes
        it. :meth:`close` (``shut=False``) then closes this process's descriptor."""
        self.closed = True

    def close(self, shut: bool = True) -> None:
        """Close the connection; further sends raise OSError. Idempotent.

        Args:
            shut: end the connection itself, waking a thread blocked reading it. False closes
                this process's descriptor alone: a copy of it elsewhere keeps the connection.
        """
        self.closed = True
        if self._released:
            return
        self._released = True
        if shut:
            shutdown(self._sock)
        self._sock.close()
