"""The driver's authenticated service: tasks report logs, progress and failures here.

Messages are put on one queue as ``(connection id, message)``; the run's monitor is the only
consumer. A connection that sends anything unauthenticated, oversized or malformed is
dropped and counted in :attr:`ChannelServer.rejected`; the run goes on.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
from typing import Any

from sparktrain import wire

CLOSED = "_closed"
FIRST_FRAME_TIMEOUT = 60.0


class _Connection:
    def __init__(self, conn_id: int, sock: socket.socket, nonce: bytes) -> None:
        self.id = conn_id
        self.sock = sock
        self.nonce = nonce
        self.send_seq = 0
        self.lock = threading.Lock()
        self.authenticated = False


class ChannelServer:
    """A TCP server for one run.

    Args:
        key: the run's HMAC key.
        bind: address to listen on (``127.0.0.1`` for local runs, ``0.0.0.0`` for clusters).
        advertise: the host name or address tasks should connect to.
    """

    def __init__(self, key: bytes, bind: str = "127.0.0.1", advertise: str | None = None) -> None:
        self.key = key
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.rejected = 0
        self._sock = socket.create_server((bind, 0), backlog=128)
        self._advertise = advertise or bind
        self._conns: dict[int, _Connection] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept, name="sparktrain-channel", daemon=True
        )
        self._acceptor.start()

    @property
    def address(self) -> str:
        """``host:port`` that tasks connect to."""
        return f"{self._advertise}:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            conn = _Connection(next(self._ids), sock, os.urandom(wire.NONCE_BYTES))
            with self._lock:
                self._conns[conn.id] = conn
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: _Connection) -> None:
        seq = 0
        try:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sock.sendall(conn.nonce)
            # A peer gets a while to prove itself; after that it may stay quiet for long.
            conn.sock.settimeout(FIRST_FRAME_TIMEOUT)
            while True:
                message = wire.read_frame(conn.sock, self.key, conn.nonce, wire.TO_SERVER, seq)
                if not conn.authenticated:
                    conn.sock.settimeout(None)
                    conn.authenticated = True
                seq += 1
                self.events.put((conn.id, message))
        except wire.FrameError:
            with self._lock:
                self.rejected += 1
        except (OSError, EOFError):
            pass
        finally:
            with self._lock:
                self._conns.pop(conn.id, None)
            try:
                conn.sock.close()
            except OSError:
                pass
            if conn.authenticated and not self._closed:
                self.events.put((conn.id, {"type": CLOSED}))

    def send(self, conn_id: int, message: dict[str, Any]) -> bool:
        """Send to one connection; False if it is gone."""
        with self._lock:
            conn = self._conns.get(conn_id)
        if conn is None or not conn.authenticated:
            return False
        try:
            with conn.lock:
                frame = wire.encode(self.key, conn.nonce, wire.TO_CLIENT, conn.send_seq, message)
                conn.send_seq += 1
                conn.sock.sendall(frame)
            return True
        except OSError:
            return False

    def broadcast(self, message: dict[str, Any], conn_ids: list[int]) -> None:
        """Send to several connections, ignoring those that are gone."""
        for conn_id in conn_ids:
            self.send(conn_id, message)

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._closed = True
        try:
            # close() alone does not wake a thread blocked in accept(); shutdown() does.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> ChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
