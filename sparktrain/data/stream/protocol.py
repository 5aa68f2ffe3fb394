"""The frames of a task's stream to its local ranks, and the handshake that opens it.

Each frame is a 1-byte type, an 8-byte big-endian length and that many bytes. A batch frame
holds one Arrow IPC record batch message (``RecordBatch.serialize()``), read back without a
copy against the schema of the last schema frame; nothing is pickled. Lengths are bounded.

The handshake, on a freshly accepted connection (the key is the run's key):

1. feeder -> rank: ``HELLO`` + a 32-byte random nonce ``ns``;
2. rank -> feeder: its local index (4 bytes), its own nonce ``nr`` and
   ``HMAC(key, "rank" | ns | index | nr)``;
3. feeder -> rank: ``HMAC(key, "feeder" | nr | ns)``.

Both sides check with :func:`hmac.compare_digest` before anything else is read, so a process
without the key can neither take a rank's rows nor pose as the feeder; the index is covered
by the MAC, so a recorded answer cannot be replayed (the nonces are fresh).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import struct
from collections.abc import Iterator

from sparktrain.errors import SparkTrainError

SCHEMA, BATCH, END, FAIL = b"S", b"B", b"E", b"X"
_KINDS = (SCHEMA, BATCH, END, FAIL)
_HEADER = struct.Struct(">cQ")
HELLO = b"sparktrain-stream-1"
NONCE = 32
_ANSWER = struct.Struct(f">I{NONCE}s32s")
# One frame holds one Arrow batch: far above any sane batch, far below what would exhaust a
# host if a length were garbage.
MAX_FRAME = 1 << 34
CREDIT = b"c"


class StreamError(SparkTrainError):
    """A task's stream to its ranks failed: a rank died, the input failed, a peer lied."""


def recv_exact(sock: socket.socket, size: int) -> bytearray:
    """Exactly ``size`` bytes from ``sock``.

    Raises:
        EOFError: the peer closed the connection first.
    """
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError(f"connection closed after {got} of {size} bytes")
        got += n
    return out


def send_frame(sock: socket.socket, kind: bytes, payload: bytes | memoryview = b"") -> None:
    """Send one frame (the header, then the payload without copying it)."""
    sock.sendall(_HEADER.pack(kind, len(payload)))
    if len(payload):
        sock.sendall(payload)


def recv_frame(sock: socket.socket) -> tuple[bytes, bytearray]:
    """The next frame's type and payload.

    Raises:
        EOFError: the connection closed.
        StreamError: an unknown type or a length over :data:`MAX_FRAME`.
    """
    kind, size = _HEADER.unpack(recv_exact(sock, _HEADER.size))
    if kind not in _KINDS or size > MAX_FRAME:
        raise StreamError(f"malformed stream frame (type {kind!r}, length {size})")
    return kind, recv_exact(sock, size)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


def greet_rank(sock: socket.socket, key: bytes) -> int:
    """Feeder side of the handshake.

    Returns:
        The local index the rank proved it holds the key for.

    Raises:
        StreamError: the peer does not hold the key.
        EOFError: the peer left during the handshake.
    """
    ours = os.urandom(NONCE)
    sock.sendall(HELLO + ours)
    index, theirs, mac = _ANSWER.unpack(recv_exact(sock, _ANSWER.size))
    if not hmac.compare_digest(mac, _mac(key, b"rank", ours, struct.pack(">I", index), theirs)):
        raise StreamError("a connection to the stream's socket did not prove the run's key")
    sock.sendall(_mac(key, b"feeder", theirs, ours))
    return int(index)


def greet_feeder(sock: socket.socket, key: bytes, index: int) -> None:
    """Rank side of the handshake.

    Raises:
        StreamError: the socket's owner does not hold the run's key.
        EOFError: the feeder closed the connection (e.g. it refused us).
    """
    hello = recv_exact(sock, len(HELLO) + NONCE)
    if not hello.startswith(HELLO):
        raise StreamError("the stream's socket did not answer as a sparktrain feeder")
    theirs = bytes(hello[len(HELLO) :])
    ours = os.urandom(NONCE)
    packed = struct.pack(">I", index)
    sock.sendall(_ANSWER.pack(index, ours, _mac(key, b"rank", theirs, packed, ours)))
    if not hmac.compare_digest(bytes(recv_exact(sock, 32)), _mac(key, b"feeder", ours, theirs)):
        raise StreamError("the stream's feeder did not prove the run's key")


# sun_path holds 108 bytes on Linux (104 on macOS), with the terminating NUL.
MAX_SOCKET_PATH = 103


@contextlib.contextmanager
def reachable(path: str) -> Iterator[str]:
    """A name by which ``bind``/``connect`` reach the socket ``path``, however long it is.

    Spark's local dirs and test folders make paths longer than a Unix socket's name may be.
    Then, on Linux, the socket is reached through an ``O_PATH`` descriptor of its folder
    (``/proc/self/fd/N/name``): the same folder and the same permission checks (the caller
    must be able to reach the folder to open it), only a shorter name.

    Raises:
        StreamError: the path is too long and the system has no ``/proc/self/fd``.
    """
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        yield path
        return
    folder, name = os.path.split(path)
    o_path = getattr(os, "O_PATH", None)
    if o_path is None or not os.path.isdir("/proc/self/fd"):
        raise StreamError(
            f"the stream's socket path {path} is longer than a Unix socket allows "
            f"({MAX_SOCKET_PATH} bytes); point TMPDIR (or the feeder's parent) at a folder "
            f"with a shorter path"
        )
    fd = os.open(folder, o_path | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)
