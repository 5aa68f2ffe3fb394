"""Being admitted by a frame server under a flood: a client dropped before the server
answered connects again, a silent stranger makes room before a peer that has sent, and the
log's counts of dropped connections add up to what was dropped."""

from __future__ import annotations

import logging
import re
import socket
import struct
import threading

import pytest

from sparktrain import wire
from sparktrain.wire.frames import MAGIC, NONCE_BYTES
from tests.helpers import wait_for

KEY = b"k" * 32
HEADER = struct.Struct(">4sI")


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


def test_a_silent_stranger_makes_room_before_a_peer_that_has_sent() -> None:
    server = wire.FrameServer(KEY, lambda *_: None, max_pending=4)
    try:
        address = wire.parse_address(server.address)
        # Half a header: it has sent something, and is the oldest.
        sender = socket.create_connection(address, timeout=5)
        assert len(wire.recv_exact(sender, NONCE_BYTES)) == NONCE_BYTES
        sender.sendall(HEADER.pack(MAGIC, 64)[:6])
        silent = []
        for _ in range(3 + 10):
            sock = socket.create_connection(address, timeout=5)
            wire.recv_exact(sock, NONCE_BYTES)  # accepted
            silent.append(sock)
        assert server.rejected == 10
        # The ten dropped were the oldest silent ones; the sender waits on.
        sender.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sender.recv(1)
        for sock in silent[:10]:
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        server.close()
        for sock in [sender, *silent]:
            sock.close()


COUNTS = re.compile(r"(\d+) connection\(s\) dropped .*?, (\d+) closed by their peer")


def test_the_logged_counts_add_up_to_what_was_dropped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sparktrain.wire")
    server = wire.FrameServer(KEY, lambda *_: None, max_pending=4)
    address = wire.parse_address(server.address)
    for _ in range(50):  # garbage: dropped
        with socket.create_connection(address, timeout=5) as sock:
            wire.recv_exact(sock, NONCE_BYTES)
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
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
