"""Being admitted by a frame server under a flood: a client dropped before the server
answered connects again, the oldest waiting connection is read before it is dropped to make
room, and the log's counts of dropped connections add up to what was dropped."""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable

import pytest

from sparktrain import wire
from sparktrain.wire.connection import Connection
from sparktrain.wire.frames import NONCE_BYTES
from sparktrain.wire.waiting import WaitingRoom
from tests.helpers import wait_for

KEY = b"k" * 32


def _fake_server(listener: socket.socket, drop_first: int, got: list[dict]) -> None:
    """Drops the first ``drop_first`` connections after their auth frame, then admits one
    and keeps the message it sends."""
    for n in range(drop_first + 1):
        conn, _ = listener.accept()
        with conn:
            nonce = b"n" * NONCE_BYTES
            conn.sendall(nonce)
            assert wire.read_frame(conn, KEY, nonce, wire.TO_SERVER, 0) == {"type": "auth"}
            if n < drop_first:
                continue  # closed unanswered, as a server making room does
            conn.sendall(wire.encode(KEY, nonce, wire.TO_CLIENT, 0, {"type": "auth"}))
            got.append(wire.read_frame(conn, KEY, nonce, wire.TO_SERVER, 1))


def test_a_client_dropped_before_it_was_answered_connects_again() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[dict] = []
    thread = threading.Thread(target=_fake_server, args=(listener, 3, got), daemon=True)
    thread.start()
    try:
        client = wire.ChannelClient(f"127.0.0.1:{listener.getsockname()[1]}", KEY, timeout=30)
        client.send({"type": "hello"})
        thread.join(10)
        client.close()
    finally:
        listener.close()
    assert client.attempts == 4
    assert got == [{"type": "hello"}]  # sent once, over the connection that was admitted


def test_nothing_listening_is_not_retried() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(ConnectionRefusedError):
        wire.ChannelClient(f"127.0.0.1:{port}", KEY, timeout=3600)  # at once, not in an hour


class Room:
    """A waiting room of ``n`` connections (0 oldest) and a log of what was done to them."""

    def __init__(self, n: int, size: int) -> None:
        self.pairs = [socket.socketpair() for _ in range(n)]
        self.conns = [Connection(i, a) for i, (a, _) in enumerate(self.pairs)]
        self.room = WaitingRoom(size)
        for conn in self.conns:
            self.room.add(conn)
        self.done: list[tuple[str, int]] = []

    def read(self, arrived: set[int]) -> Callable[[Connection], None]:
        """Reading admits (or closes) the connections whose frame (or EOF) has ``arrived``."""

        def read(conn: Connection) -> None:
            self.done.append(("read", conn.id))
            if conn.id in arrived:
                self.room.remove(conn)

        return read

    def drop(self, conn: Connection) -> None:
        self.done.append(("drop", conn.id))
        self.room.remove(conn)

    def close(self) -> None:
        for a, b in self.pairs:
            a.close()
            b.close()


def test_the_oldest_is_read_before_it_is_dropped() -> None:
    room = Room(4, size=4)
    try:
        room.room.make_room(room.read(set()), room.drop)
        assert room.done == [("read", 0), ("drop", 0)]
        assert len(room.room) == 3 and room.room.oldest() is room.conns[1]
    finally:
        room.close()


def test_a_connection_whose_frame_has_arrived_is_admitted_not_dropped() -> None:
    room = Room(4, size=4)
    try:
        # The oldest has sent its frame (or hung up) meanwhile: reading takes it out, and
        # there is room without a drop; and so again for the next.
        room.room.make_room(room.read({0}), room.drop)
        assert room.done == [("read", 0)]
        room.room.add(Connection(9, room.pairs[0][1]))
        room.room.make_room(room.read({1}), room.drop)
        assert room.done == [("read", 0), ("read", 1)]
        assert len(room.room) == 3
    finally:
        room.close()


def test_the_oldest_makes_room_whatever_it_sent() -> None:
    # Silent or not, the oldest goes first: a stranger that sends a byte cannot make a new
    # connection (silent until its first frame arrives) the one to go.
    room = Room(6, size=4)
    try:
        room.room.make_room(room.read(set()), room.drop)
        assert room.done == [
            ("read", 0),
            ("drop", 0),
            ("read", 1),
            ("drop", 1),
            ("read", 2),
            ("drop", 2),
        ]
        assert room.room.oldest() is room.conns[3]
    finally:
        room.close()


COUNTS = re.compile(r"(\d+) connection\(s\) dropped .*?, (\d+) closed by their peer")


def test_the_logged_counts_add_up_to_what_was_dropped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sparktrain.wire")
    server = wire.FrameServer(KEY, lambda *_: None, max_pending=4)
    address = wire.parse_address(server.address)
    for _ in range(50):  # garbage: dropped
        with socket.create_connection(address, timeout=5) as sock:
            wire.recv_exact(sock, NONCE_BYTES)
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert sock.recv(2) == wire.REFUSED  # refused, and closed
            assert sock.recv(1) == b""
    for _ in range(20):  # hung up without a word: closed by their peer
        with socket.create_connection(address, timeout=5) as sock:
            wire.recv_exact(sock, NONCE_BYTES)
    wait_for(lambda: server.abandoned == 20, 10, "the server saw every hang-up")
    server.close()
    said = [COUNTS.search(r.getMessage()) for r in caplog.records]
    assert sum(int(m[1]) for m in said if m) == server.rejected == 50
    assert sum(int(m[2]) for m in said if m) == server.abandoned == 20
    assert "(in all: 50 dropped, 20 closed)" in caplog.records[-1].getMessage()
