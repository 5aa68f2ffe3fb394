"""The frame server under unauthenticated traffic: it authenticates before it buffers, holds
every connection to absolute deadlines, and bounds connections (and so threads)."""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparktrain import wire
from sparktrain.wire import intake as intake_mod
from sparktrain.wire import server as server_mod
from sparktrain.wire.frames import MAGIC, NONCE_BYTES

KEY = b"k" * 32
HEADER = struct.Struct(">4sI")


class Collecting:
    """A FrameServer whose messages and closes land on a queue."""

    def __init__(self, **kwargs: Any) -> None:
        self.events: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self.server = wire.FrameServer(
            KEY,
            lambda conn_id, message: self.events.put(("message", conn_id, message)),
            lambda conn_id: self.events.put(("closed", conn_id, None)),
            **kwargs,
        )

    def next(self, timeout: float = 5.0) -> tuple[str, int, Any]:
        return self.events.get(timeout=timeout)


@pytest.fixture
def collecting(request: pytest.FixtureRequest) -> Iterator[Collecting]:
    srv = Collecting(**getattr(request, "param", {}))
    yield srv
    srv.server.close()


def raw_connect(srv: wire.FrameServer) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(wire.parse_address(srv.address), timeout=5)
    return sock, wire.recv_exact(sock, NONCE_BYTES)


def dropped(sock: socket.socket, within: float = 5.0) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_client_authenticates_with_a_small_first_frame(collecting: Collecting) -> None:
    client = wire.ChannelClient(collecting.server.address, KEY, timeout=5)
    try:
        big = {"type": "log", "line": "x" * (wire.MAX_FRAME - 100)}
        client.send(big)  # only an authenticated connection may send this much
        kind, _, message = collecting.next()
        assert kind == "message" and message == big  # the auth frame itself is not delivered
    finally:
        client.close()
    assert collecting.next()[0] == "closed"
    assert collecting.server.rejected == 0


def test_a_large_first_frame_is_refused_before_its_body_is_read(collecting: Collecting) -> None:
    sock, _ = raw_connect(collecting.server)
    try:
        # A header announcing more than an authentication frame may hold, and no body at all:
        # the server must drop it on the header, not wait to buffer the body.
        sock.sendall(HEADER.pack(MAGIC, server_mod.AUTH_FRAME_MAX + 1))
        assert dropped(sock)
    finally:
        sock.close()
    assert collecting.server.rejected == 1
    assert collecting.events.empty()


def test_a_trickle_of_bytes_does_not_hold_a_connection_open(
    collecting: Collecting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_mod, "AUTH_TIMEOUT", 0.5)
    sock, nonce = raw_connect(collecting.server)
    frame = wire.encode(b"w" * 32, nonce, wire.TO_SERVER, 0, {"type": "log", "line": "x" * 200})
    gone = False
    try:
        # One byte at a time, each well within any per-byte timeout: only an absolute
        # deadline ends this connection.
        for byte in frame:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                gone = True
                break
            if dropped(sock, within=0.05):
                gone = True
                break
    finally:
        sock.close()
    assert gone, "the server kept a trickling unauthenticated connection for the whole frame"
    wait_until(lambda: collecting.server.rejected == 1)


@pytest.mark.parametrize("collecting", [{"max_pending": 4}], indirect=True)
def test_a_flood_of_silent_connections_cannot_lock_a_rank_out(collecting: Collecting) -> None:
    srv = collecting.server
    baseline = threading.active_count()
    flood = [raw_connect(srv)[0] for _ in range(40)]
    try:
        # The oldest silent connections are dropped to make room: at most 4 wait at once.
        wait_until(lambda: len(srv._conns) <= 4)
        assert threading.active_count() <= baseline + 4
        client = wire.ChannelClient(srv.address, KEY, timeout=5)
        try:
            client.send({"type": "log", "line": "still here"})
            assert collecting.next()[2] == {"type": "log", "line": "still here"}
        finally:
            client.close()
    finally:
        for sock in flood:
            sock.close()


@pytest.mark.parametrize("collecting", [{"max_connections": 2}], indirect=True)
def test_authenticated_connections_are_bounded(collecting: Collecting) -> None:
    srv = collecting.server
    clients = [wire.ChannelClient(srv.address, KEY, timeout=5) for _ in range(2)]
    try:
        for i, client in enumerate(clients):
            client.send({"n": i})
            assert collecting.next()[2] == {"n": i}
        # Dropped as its first frame arrives, each time it tries: the server holds no more.
        with pytest.raises(ConnectionError, match="did not admit this connection within 1s"):
            wire.ChannelClient(srv.address, KEY, timeout=1)
        assert srv.rejected >= 1
        assert srv.drops._latest == "more than 2 authenticated connections"
    finally:
        for client in clients:
            client.close()


def test_rejections_are_logged_without_flooding_the_log(
    collecting: Collecting, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="sparktrain.wire")
    for _ in range(5):
        sock, _ = raw_connect(collecting.server)
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\x00" * 40)
        assert dropped(sock)
        sock.close()
    wait_until(lambda: collecting.server.rejected == 5)
    records = [r for r in caplog.records if r.name == "sparktrain.wire"]
    assert len(records) == 1  # the first one; the rest wait for the next interval
    assert "failed authentication or framing" in records[0].getMessage()
    assert "bad magic" in records[0].getMessage()


class Peak:
    """The most threads of this process, and of the server's connections, seen while it runs."""

    def __init__(self, srv: wire.FrameServer) -> None:
        self.srv = srv
        self.threads = threading.active_count()
        self.conns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.threads = max(self.threads, threading.active_count())
            self.conns = max(self.conns, len(self.srv._conns))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def partial_frames(srv: wire.FrameServer, n: int) -> list[socket.socket]:
    """``n`` unauthenticated connections, each holding a partial or hostile first frame."""
    openings = [
        HEADER.pack(MAGIC, 64)[:6],  # half a header
        HEADER.pack(MAGIC, 64) + b"\0" * 20,  # a header and part of the HMAC
        HEADER.pack(MAGIC, 0xFFFFFFFF),  # a huge declared length
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # garbage (a TLS hello)
    ]
    socks = []
    for i in range(n):
        sock = socket.create_connection(wire.parse_address(srv.address), timeout=5)
        sock.sendall(openings[i % len(openings)])
        socks.append(sock)
    return socks


@pytest.mark.parametrize("collecting", [{"max_pending": 8, "max_connections": 4}], indirect=True)
def test_many_partial_frames_keep_threads_and_connections_bounded(collecting: Collecting) -> None:
    srv = collecting.server
    baseline = threading.active_count()
    flood: list[socket.socket] = []
    try:
        with Peak(srv) as peak:
            flood += partial_frames(srv, 150)
            # A rank arriving while the flood holds every pending slot still gets through...
            client = wire.ChannelClient(srv.address, KEY, timeout=5)
            try:
                client.send({"type": "log", "line": "through the flood"})
                assert collecting.next()[2] == {"type": "log", "line": "through the flood"}
                # ...and, once authenticated, is never dropped to make room for more.
                flood += partial_frames(srv, 150)
                client.send({"type": "log", "line": "still here"})
                assert collecting.next()[2] == {"type": "log", "line": "still here"}
            finally:
                client.close()
            # Every one of them is dropped (failed, or to make room), but the last 8 held.
            wait_until(lambda: srv.rejected >= 300 - 8)
        # One thread per connection the server holds, never more than it may hold at once,
        # however many connections came (Peak's own thread is the +1).
        assert peak.conns <= 8 + 4
        assert peak.threads <= baseline + 1 + 8 + 4
    finally:
        for sock in flood:
            sock.close()


@pytest.mark.parametrize("collecting", [{"max_connections": 1500}], indirect=True)
def test_many_authenticated_connections_share_one_thread(collecting: Collecting) -> None:
    srv = collecting.server
    before = set(threading.enumerate())
    clients: list[wire.ChannelClient] = []
    try:
        for i in range(1500):
            clients.append(wire.ChannelClient(srv.address, KEY, timeout=5))
            clients[-1].send({"n": i})
        got = sorted(collecting.next()[2]["n"] for _ in range(1500))
        assert got == list(range(1500))
        # Not one thread started since the first of them (the server's own was there); the
        # threads counted are these, not the process's (another test's may end meanwhile).
        assert [t.name for t in threading.enumerate() if t not in before] == []
        # Every one of them can still be answered.
        conn_ids = list(srv._conns)
        srv.broadcast({"type": "x"}, conn_ids)
        assert all(c.receive() == {"type": "x"} for c in clients)
    finally:
        for client in clients:
            client.close()
    wait_until(lambda: not srv._conns)
    assert srv.rejected == 0


def test_a_peer_that_never_reads_does_not_block_sends_to_others(collecting: Collecting) -> None:
    srv = collecting.server
    stuck = wire.ChannelClient(srv.address, KEY, timeout=5)
    reader = wire.ChannelClient(srv.address, KEY, timeout=5)
    try:
        stuck.send({"who": "stuck"})
        reader.send({"who": "reader"})
        ids = {m["who"]: conn_id for _, conn_id, m in (collecting.next(), collecting.next())}
        big = {"type": "x", "data": "y" * (wire.MAX_FRAME - 100)}
        # The stuck peer reads nothing: what its socket does not take waits in the server,
        # up to MAX_OUTBOX, and then it is dropped; no send ever waits for it.
        sent = 0
        while srv.send(ids["stuck"], big):
            sent += 1
            assert srv.send(ids["reader"], {"type": "x", "n": sent})
            assert reader.receive() == {"type": "x", "n": sent}
            assert sent < 1000, "the server queued without bound for a peer that never reads"
        assert collecting.next() == ("closed", ids["stuck"], None)
        assert srv.rejected == 1  # and counted
        assert srv.send(ids["reader"], {"type": "still"})
        assert reader.receive() == {"type": "still"}
    finally:
        stuck.close()
        reader.close()


def test_an_idle_authenticated_connection_is_kept(
    collecting: Collecting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_mod, "AUTH_TIMEOUT", 0.2)
    monkeypatch.setattr(intake_mod, "FRAME_TIMEOUT", 0.2)
    client = wire.ChannelClient(collecting.server.address, KEY, timeout=5)
    try:
        client.send({"n": 0})
        assert collecting.next()[2] == {"n": 0}
        # Quiet for well past both deadlines: neither applies between frames.
        with pytest.raises(queue.Empty):
            collecting.events.get(timeout=0.8)
        client.send({"n": 1})
        assert collecting.next()[2] == {"n": 1}
    finally:
        client.close()
    assert collecting.server.rejected == 0


def test_half_a_frame_from_an_authenticated_peer_is_held_to_the_frame_deadline(
    collecting: Collecting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_mod, "FRAME_TIMEOUT", 0.3)
    sock, nonce = raw_connect(collecting.server)
    try:
        sock.sendall(wire.encode(KEY, nonce, wire.TO_SERVER, 0, {"type": "auth"}))
        frame = wire.encode(KEY, nonce, wire.TO_SERVER, 1, {"n": 1})
        sock.sendall(frame[:-3])  # and the rest never comes
        assert dropped(sock)
    finally:
        sock.close()
    assert collecting.next()[0] == "closed"
    assert collecting.server.rejected == 1


def test_a_full_consumer_pauses_only_the_sender_that_fills_it() -> None:
    delivered: queue.Queue[tuple[int, Any]] = queue.Queue()
    full = threading.Event()
    srv = wire.FrameServer(
        KEY,
        lambda conn_id, message: delivered.put((conn_id, message)),
        room=lambda: not full.is_set(),
    )
    chatty = wire.ChannelClient(srv.address, KEY, timeout=5)
    quiet = wire.ChannelClient(srv.address, KEY, timeout=5)
    try:
        chatty.send({"n": -1})
        delivered.get(timeout=5)
        full.set()
        for i in range(200):
            chatty.send({"n": i})
        # One message gets through, then its connection is no longer read...
        assert delivered.get(timeout=5)[1] == {"n": 0}
        # ...but a connection that was not sending still is.
        quiet.send({"quiet": True})
        assert delivered.get(timeout=5)[1] == {"quiet": True}
        with pytest.raises(queue.Empty):
            delivered.get(timeout=0.3)
        full.clear()
        srv.resume()
        assert [delivered.get(timeout=5)[1]["n"] for _ in range(199)] == list(range(1, 200))
        assert srv.rejected == 0
    finally:
        chatty.close()
        quiet.close()
        srv.close()


def test_a_server_larger_than_the_file_limit_allows_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    from sparktrain.errors import ConfigurationError

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    with pytest.raises(ConfigurationError, match="RLIMIT_NOFILE"):
        wire.FrameServer(KEY, lambda conn_id, message: None, max_connections=hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)


def test_the_soft_file_limit_is_raised_when_a_server_needs_it() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, soft + 1000) - server_mod.FD_RESERVE
    if want <= soft - server_mod.FD_RESERVE:
        pytest.skip("the soft limit is already the hard limit")
    try:
        srv = wire.FrameServer(KEY, lambda conn_id, message: None, max_connections=want - 64)
        srv.close()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_sender_paused_again_after_a_resume_is_resumed_again() -> None:
    delivered: queue.Queue[Any] = queue.Queue()
    srv = wire.FrameServer(
        KEY,
        lambda conn_id, message: delivered.put(message),
        room=lambda: delivered.qsize() < 10,  # the consumer takes ten at a time
    )
    client = wire.ChannelClient(srv.address, KEY, timeout=5)
    try:
        for i in range(100):
            client.send({"n": i})
        got: list[int] = []
        while len(got) < 100:
            got += [delivered.get(timeout=5)["n"] for _ in range(min(10, 100 - len(got)))]
            srv.resume()
        assert got == list(range(100))
    finally:
        client.close()
        srv.close()
