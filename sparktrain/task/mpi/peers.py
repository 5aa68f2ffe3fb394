"""The listener every task of an MPI run keeps, for mpirun's agent and the run's other tasks."""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from sparktrain import wire

FIRST_FRAME_TIMEOUT = 60.0

PeerEvent = Callable[[str, int, Any], None]


class PeerServer:
    """An authenticated listener for the other processes of one MPI run.

    Events are handed to ``on_event(kind, conn_id, message)``: ``("peer", id, message)`` for
    each authenticated frame and ``("peer_closed", id, None)`` when an authenticated
    connection ends. Frames that fail authentication drop the connection silently.

    Args:
        key: the run's HMAC key.
        on_event: the callback, called from connection threads.
        bind: address to listen on (default: every interface).
    """

    def __init__(self, key: bytes, on_event: PeerEvent, bind: str = "") -> None:
        self.key = key
        self._on_event = on_event
        self._sock = socket.create_server((bind, 0), backlog=64)
        self._conns: dict[int, tuple[socket.socket, bytes, threading.Lock, list[int]]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        threading.Thread(target=self._accept, name="sparktrain-peers", daemon=True).start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._sock.getsockname()[1])

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            conn_id = next(self._ids)
            threading.Thread(target=self._serve, args=(conn_id, sock), daemon=True).start()

    def _serve(self, conn_id: int, sock: socket.socket) -> None:
        nonce = os.urandom(wire.NONCE_BYTES)
        authenticated = False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(nonce)
            sock.settimeout(FIRST_FRAME_TIMEOUT)
            for seq in itertools.count():
                message = wire.read_frame(sock, self.key, nonce, wire.TO_SERVER, seq)
                if not authenticated:
                    authenticated = True
                    sock.settimeout(None)
                    with self._lock:
                        self._conns[conn_id] = (sock, nonce, threading.Lock(), [0])
                self._on_event("peer", conn_id, message)
        except (OSError, EOFError, wire.FrameError):
            pass
        finally:
            with self._lock:
                self._conns.pop(conn_id, None)
            try:
                sock.close()
            except OSError:
                pass
            if authenticated and not self._closed:
                self._on_event("peer_closed", conn_id, None)

    def send(self, conn_id: int, message: dict[str, Any]) -> bool:
        """Send to one connection; False when it is gone."""
        with self._lock:
            entry = self._conns.get(conn_id)
        if entry is None:
            return False
        sock, nonce, lock, seq = entry
        try:
            with lock:
                frame = wire.encode(self.key, nonce, wire.TO_CLIENT, seq[0], message)
                seq[0] += 1
                sock.sendall(frame)
            return True
        except (OSError, wire.FrameError):
            return False

    def drop(self, conn_id: int) -> None:
        """Close one connection (its peer sees EOF)."""
        with self._lock:
            entry = self._conns.get(conn_id)
        if entry is not None:
            try:
                entry[0].shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            ids = list(self._conns)
        for conn_id in ids:
            self.drop(conn_id)
