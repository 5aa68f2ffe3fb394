"""HMAC frames (sparktrain.wire) and the driver's ChannelServer, over real local sockets."""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparktrain import contract, wire
from sparktrain.driver.channel import CLOSED, ChannelServer
from sparktrain.wire import MAC_BYTES, MAGIC, MAX_FRAME, NONCE_BYTES, FrameError

KEY = b"k" * 32
NONCE = b"n" * NONCE_BYTES
HEADER = struct.Struct(">4sI")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    # A frame handler that blocked would hang the test; fail it instead.
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


def frame(
    message: dict[str, Any],
    seq: int = 0,
    key: bytes = KEY,
    nonce: bytes = NONCE,
    direction: bytes = wire.TO_SERVER,
) -> bytes:
    return wire.encode(key, nonce, direction, seq, message)


def read(sock: socket.socket, seq: int = 0, direction: bytes = wire.TO_SERVER) -> dict[str, Any]:
    return wire.read_frame(sock, KEY, NONCE, direction, seq)


# --- frames ------------------------------------------------------------------------------------


def test_round_trip(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    messages = [
        {"type": "log", "rank": 3, "line": "héllo ✓"},
        {},
        {"nested": {"x": [1, 2.5, None]}},
    ]
    for seq, message in enumerate(messages):
        a.sendall(frame(message, seq))
    assert [read(b, seq) for seq in range(len(messages))] == messages


def test_frame_layout() -> None:
    data = frame({"a": 1})
    magic, length = HEADER.unpack(data[: HEADER.size])
    assert magic == MAGIC
    body = data[HEADER.size + MAC_BYTES :]
    assert length == len(body)
    assert json.loads(body) == {"a": 1}


def test_encode_refuses_oversized_messages() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        frame({"blob": "x" * MAX_FRAME})


def test_largest_frame_round_trips(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    filler = MAX_FRAME - len(json.dumps({"b": ""}, separators=(",", ":")))
    message = {"b": "y" * filler}
    data = frame(message)
    assert len(data) == HEADER.size + MAC_BYTES + MAX_FRAME
    sender = threading.Thread(target=a.sendall, args=(data,))
    sender.start()
    assert read(b) == message
    sender.join(5)


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


@pytest.mark.parametrize("where", ["mac first byte", "mac last byte", "body", "body last byte"])
def test_tampering_is_detected(pair: tuple[socket.socket, socket.socket], where: str) -> None:
    a, b = pair
    data = frame({"type": "result", "value": 12345})
    offset = {
        "mac first byte": HEADER.size,
        "mac last byte": HEADER.size + MAC_BYTES - 1,
        "body": HEADER.size + MAC_BYTES + 3,
        "body last byte": len(data) - 1,
    }[where]
    a.sendall(_flip(data, offset))
    with pytest.raises(FrameError, match="authentication failed"):
        read(b)


@pytest.mark.parametrize(
    "change",
    ["key", "nonce (replay onto another connection)", "direction (reflected)", "seq (reordered)"],
)
def test_frame_is_bound_to_key_nonce_direction_and_seq(
    pair: tuple[socket.socket, socket.socket], change: str
) -> None:
    a, b = pair
    kwargs: dict[str, Any] = {
        "key": {"key": b"x" * 32},
        "nonce (replay onto another connection)": {"nonce": os.urandom(NONCE_BYTES)},
        "direction (reflected)": {"direction": wire.TO_CLIENT},
        "seq (reordered)": {"seq": 1},
    }[change]
    a.sendall(frame({"type": "log"}, **kwargs))
    with pytest.raises(FrameError, match="authentication failed"):
        read(b, seq=0)


def test_swapped_frames_are_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    first, second = frame({"n": 0}, seq=0), frame({"n": 1}, seq=1)
    a.sendall(second + first)
    with pytest.raises(FrameError, match="authentication failed"):
        read(b, seq=0)


def test_oversized_length_is_refused_before_the_body_is_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    # Only the header arrives; a reader that waited for 4 GiB of body would block.
    a.sendall(HEADER.pack(MAGIC, 0xFFFFFFFF))
    b.settimeout(3)  # a reader that waited for the body would raise TimeoutError instead
    with pytest.raises(FrameError, match="exceeds"):
        read(b)
    a.sendall(HEADER.pack(MAGIC, MAX_FRAME + 1))
    with pytest.raises(FrameError, match=f"frame length {MAX_FRAME + 1} exceeds {MAX_FRAME}"):
        read(b)


def test_bad_magic_is_refused_before_anything_else_is_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(HEADER.pack(b"HTTP", 10))  # nothing follows the header
    b.settimeout(3)  # a reader that waited for the body would raise TimeoutError instead
    with pytest.raises(FrameError, match="bad magic"):
        read(b)


def _authentic_raw(body: bytes, seq: int = 0) -> bytes:
    mac = wire.frames._mac(KEY, NONCE, wire.TO_SERVER, seq, body)
    return HEADER.pack(MAGIC, len(body)) + mac + body


@pytest.mark.parametrize(
    "body, match",
    [
        (b"not json", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"", "body is not JSON"),
        (b"[1, 2]", "body is not a JSON object"),
        (b'"text"', "body is not a JSON object"),
        (b"42", "body is not a JSON object"),
        (b"null", "body is not a JSON object"),
    ],
)
def test_authentic_body_must_be_a_json_object(
    pair: tuple[socket.socket, socket.socket], body: bytes, match: str
) -> None:
    a, b = pair
    a.sendall(_authentic_raw(body))
    with pytest.raises(FrameError, match=match):
        read(b)


def test_eof_mid_frame_is_eof_error(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    data = frame({"type": "log", "line": "x" * 100})
    a.sendall(data[: len(data) // 2])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError):
        read(b)


def test_eof_before_a_frame_is_eof_error(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError):
        read(b)


@pytest.mark.parametrize(
    "address, parsed",
    [
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("host.example:6000", ("host.example", 6000)),
        ("[::1]:5000", ("::1", 5000)),
        ("[fe80::1]:1", ("fe80::1", 1)),
    ],
)
def test_parse_address(address: str, parsed: tuple[str, int]) -> None:
    assert wire.parse_address(address) == parsed


def test_new_key_is_random_and_long() -> None:
    keys = {wire.new_key() for _ in range(4)}
    assert len(keys) == 4 and all(len(k) == 32 for k in keys)


# --- ChannelServer ----------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    with ChannelServer(wire.new_key()) as srv:
        yield srv


def next_event(srv: ChannelServer, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
    return srv.events.get(timeout=timeout)


def raw_connect(srv: ChannelServer) -> tuple[socket.socket, bytes]:
    """A plain TCP connection to the server, and the nonce it was sent."""
    sock = socket.create_connection(wire.parse_address(srv.address), timeout=5)
    return sock, wire.recv_exact(sock, NONCE_BYTES)


def wait_dropped(sock: socket.socket) -> None:
    """Block until the server closes ``sock`` (it counts a rejection before closing)."""
    sock.settimeout(5)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    sock.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_client_messages_arrive_in_order(server: ChannelServer) -> None:
    client = wire.ChannelClient(server.address, server.key, timeout=5)
    try:
        for i in range(50):
            client.send({"type": "log", "n": i})
        got = [next_event(server) for _ in range(50)]
        assert [m["n"] for _, m in got] == list(range(50))
        assert len({conn_id for conn_id, _ in got}) == 1
    finally:
        client.close()
    assert server.rejected == 0


def test_each_connection_has_its_own_id(server: ChannelServer) -> None:
    clients = [wire.ChannelClient(server.address, server.key, timeout=5) for _ in range(3)]
    try:
        ids = []
        for i, client in enumerate(clients):
            client.send({"i": i})
            conn_id, message = next_event(server)
            assert message == {"i": i}
            ids.append(conn_id)
        assert len(set(ids)) == 3
        # Replies go to the right connection.
        for i, conn_id in enumerate(ids):
            assert server.send(conn_id, {"to": i})
        assert [c.receive() for c in clients] == [{"to": 0}, {"to": 1}, {"to": 2}]
    finally:
        for client in clients:
            client.close()


def test_address_and_advertise() -> None:
    with ChannelServer(wire.new_key(), bind="127.0.0.1", advertise="driver.example") as srv:
        host, port = wire.parse_address(srv.address)
        assert host == "driver.example" and port > 0


def _garbage(kind: str, nonce: bytes) -> bytes:
    if kind == "random bytes":
        data = random.Random(7).randbytes(256)
        assert not data.startswith(MAGIC)
        return data
    if kind == "bad magic":
        return HEADER.pack(b"GET ", 4) + b"\x00" * (MAC_BYTES + 4)
    if kind == "huge length":
        return HEADER.pack(MAGIC, 0xFFFFFFFF)
    if kind == "wrong key":
        return wire.encode(b"w" * 32, nonce, wire.TO_SERVER, 0, {"type": "log", "line": "x"})
    if kind == "wrong nonce (replay)":
        return wire.encode(KEY, os.urandom(NONCE_BYTES), wire.TO_SERVER, 0, {"type": "log"})
    if kind == "reflected direction":
        return wire.encode(KEY, nonce, wire.TO_CLIENT, 0, {"type": "log"})
    raise AssertionError(kind)


GARBAGE = [
    "random bytes",
    "bad magic",
    "huge length",
    "wrong key",
    "wrong nonce (replay)",
    "reflected direction",
]


@pytest.mark.parametrize("kind", GARBAGE)
def test_garbage_connection_is_dropped_and_counted(kind: str) -> None:
    with ChannelServer(KEY) as srv:
        good = wire.ChannelClient(srv.address, srv.key, timeout=5)
        try:
            good.send({"n": 0})
            good_id, _ = next_event(srv)
            sock, nonce = raw_connect(srv)
            sock.sendall(_garbage(kind, nonce))
            wait_dropped(sock)
            assert srv.rejected == 1
            # The good connection is unaffected and can still talk both ways.
            good.send({"n": 1})
            assert next_event(srv) == (good_id, {"n": 1})
            assert srv.send(good_id, {"type": "ping"})
            assert good.receive() == {"type": "ping"}
        finally:
            good.close()
        # Only the authenticated connection reports its end.
        assert next_event(srv) == (good_id, {"type": CLOSED})
        assert srv.events.empty()


def test_every_kind_of_garbage_at_once(server: ChannelServer) -> None:
    good = wire.ChannelClient(server.address, server.key, timeout=5)
    try:
        socks = [raw_connect(server) for _ in GARBAGE]
        for (sock, nonce), kind in zip(socks, GARBAGE, strict=True):
            sock.sendall(_garbage(kind, nonce))
        for i in range(20):
            good.send({"n": i})
        for sock, _ in socks:
            wait_dropped(sock)
        assert server.rejected == len(GARBAGE)
        assert [next_event(server)[1]["n"] for _ in range(20)] == list(range(20))
    finally:
        good.close()


def test_a_replayed_frame_from_another_connection_is_rejected(server: ChannelServer) -> None:
    good = wire.ChannelClient(server.address, server.key, timeout=5)
    try:
        # What an eavesdropper saw on the good connection, replayed on its own connection.
        seen = wire.encode(server.key, good._nonce, wire.TO_SERVER, 0, {"type": "failure"})
        sock, _ = raw_connect(server)
        sock.sendall(seen)
        wait_dropped(sock)
        assert server.rejected == 1
        assert server.events.empty()
    finally:
        good.close()


def test_a_later_bad_frame_drops_an_authenticated_connection(server: ChannelServer) -> None:
    sock, nonce = raw_connect(server)
    try:
        sock.sendall(wire.encode(server.key, nonce, wire.TO_SERVER, 0, {"n": 0}))
        conn_id, message = next_event(server)
        assert message == {"n": 0}
        # seq 0 again: a replay of the first frame on the same connection.
        sock.sendall(wire.encode(server.key, nonce, wire.TO_SERVER, 0, {"n": 0}))
        wait_dropped(sock)
    finally:
        sock.close()
    assert server.rejected == 1
    assert next_event(server) == (conn_id, {"type": CLOSED})


def test_server_send_reaches_client_receive(server: ChannelServer) -> None:
    client = wire.ChannelClient(server.address, server.key, timeout=5)
    try:
        client.send({"type": "hello"})
        conn_id, _ = next_event(server)
        assert server.send(conn_id, {"type": "abort", "reason": "rank 1 failed"})
        assert server.send(conn_id, {"type": "abort", "reason": "again"})
        assert client.receive() == {"type": "abort", "reason": "rank 1 failed"}
        assert client.receive() == {"type": "abort", "reason": "again"}
        server.broadcast({"type": "x"}, [conn_id, 9999])
        assert client.receive() == {"type": "x"}
    finally:
        client.close()


def test_send_to_unknown_or_unauthenticated_connection_is_false(server: ChannelServer) -> None:
    assert server.send(12345, {"type": "abort"}) is False
    sock, _ = raw_connect(server)
    try:
        wait_until(lambda: len(server._conns) == 1)
        (conn_id,) = list(server._conns)
        # It has not proven it holds the key: nothing is sent to it.
        assert server.send(conn_id, {"type": "abort"}) is False
    finally:
        sock.close()


def test_send_after_client_closed_is_false(server: ChannelServer) -> None:
    client = wire.ChannelClient(server.address, server.key, timeout=5)
    client.send({"type": "hello"})
    conn_id, _ = next_event(server)
    client.close()
    assert next_event(server) == (conn_id, {"type": CLOSED})
    assert server.send(conn_id, {"type": "abort"}) is False


def test_client_close_event_only_for_authenticated_connections(server: ChannelServer) -> None:
    # Connections that never authenticated come and go without a trace.
    quiet, _ = raw_connect(server)
    quiet.close()
    short, _ = raw_connect(server)
    short.sendall(b"SP")  # half a header, then gone
    short.close()
    wait_until(lambda: not server._conns)
    assert server.events.empty()
    assert server.rejected == 0  # EOF is not an attack

    client = wire.ChannelClient(server.address, server.key, timeout=5)
    client.send({"type": "hello"})
    conn_id, _ = next_event(server)
    client.close()
    assert next_event(server) == (conn_id, {"type": CLOSED})
    with pytest.raises(queue.Empty):
        server.events.get(timeout=0.2)


@pytest.mark.parametrize("first", [True, False], ids=["its answer to auth", "a later frame"])
def test_client_refuses_a_forged_server_frame(first: bool) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        nonce = os.urandom(NONCE_BYTES)
        forged = {"type": "auth"} if first else {"type": "abort"}

        def fake_driver() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(nonce)
                wire.read_frame(conn, KEY, nonce, wire.TO_SERVER, 0)  # the client's auth
                if not first:  # a true answer: the client is admitted
                    conn.sendall(wire.encode(KEY, nonce, wire.TO_CLIENT, 0, {"type": "auth"}))
                seq = 0 if first else 1
                conn.sendall(wire.encode(b"z" * 32, nonce, wire.TO_CLIENT, seq, forged))
                while conn.recv(1 << 16):  # until the client has closed
                    pass

        thread = threading.Thread(target=fake_driver, daemon=True)
        thread.start()
        if first:
            # Not this run's driver: no retry, and an error that says so.
            with pytest.raises(ConnectionError, match="failed authentication"):
                wire.ChannelClient(address, KEY, timeout=5)
        else:
            client = wire.ChannelClient(address, KEY, timeout=5)
            try:
                with pytest.raises(FrameError, match="authentication failed"):
                    client.receive()
            finally:
                client.close()
        thread.join(5)
        assert not thread.is_alive()
    finally:
        listener.close()


def test_client_send_after_close_raises_oserror(server: ChannelServer) -> None:
    client = wire.ChannelClient(server.address, server.key, timeout=5)
    client.close()
    assert client.closed
    with pytest.raises(OSError):
        client.send({"type": "log"})


def test_server_close_ends_connections_without_closed_events() -> None:
    srv = ChannelServer(wire.new_key())
    client = wire.ChannelClient(srv.address, srv.key, timeout=5)
    client.send({"n": 0})
    next_event(srv)
    srv.close()
    with pytest.raises(EOFError):
        client.receive()
    client.close()
    with pytest.raises(queue.Empty):
        srv.events.get(timeout=0.2)


def test_server_close_stops_accepting() -> None:
    srv = ChannelServer(wire.new_key())
    address = wire.parse_address(srv.address)
    # As in a real run, the server's thread is blocked in select() when the server is closed.
    ident = srv._thread.ident
    wait_until(lambda: sys._current_frames()[ident].f_code.co_name == "select")
    srv.close()
    try:
        sock = socket.create_connection(address, timeout=1)
    except OSError:
        return  # refused: what close() should mean
    try:
        sock.settimeout(1)
        try:
            nonce = sock.recv(NONCE_BYTES)
        except OSError:
            nonce = b""
        assert nonce == b"", "a closed ChannelServer accepted and served a connection"
    finally:
        sock.close()


def test_report_with_numpy_step_does_not_raise(
    server: ChannelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    np = pytest.importorskip("numpy")
    from sparktrain.worker import context

    monkeypatch.setattr(context, "_client_state", {})
    monkeypatch.setenv(contract.CHANNEL_ENV, server.address)
    monkeypatch.setenv(contract.KEY_ENV, server.key.hex())
    monkeypatch.setenv("RANK", "0")
    try:
        context.report(step=np.int64(3), epoch=1, loss=np.float32(0.5))
        _, message = next_event(server)
        assert message["step"] == 3 and message["metrics"] == {"loss": 0.5}
    finally:
        client = context._client_state.get("client")
        if client is not None:
            client.close()


def test_worker_context_messages_reach_the_channel(
    server: ChannelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparktrain.worker import context

    monkeypatch.setattr(context, "_client_state", {})
    monkeypatch.setenv(contract.CHANNEL_ENV, server.address)
    monkeypatch.setenv(contract.KEY_ENV, server.key.hex())
    monkeypatch.setenv("RANK", "2")
    try:
        context.log_to_driver("hello")
        context.report(step=5, loss=0.25, acc="n/a", bad=float("nan"))
        assert next_event(server)[1] == {"type": "user_log", "rank": 2, "message": "hello"}
        assert next_event(server)[1] == {
            "type": "report",
            "rank": 2,
            "step": 5,
            "epoch": None,
            "metrics": {"loss": 0.25},
        }
    finally:
        client = context._client_state.get("client")
        if client is not None:
            client.close()
