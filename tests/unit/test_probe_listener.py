"""The probe listener against strangers (real sockets on loopback): connections that never
send, or send slowly, held open while real probes run, never turn into a wrong verdict; the
listener is one thread, holds few connections, and listens where it is told."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sparktrain.layout.cluster import TaskInfo
from sparktrain.task import interface_probe as probe_module
from sparktrain.task.interface_probe import ProbeListener, _answer, probe, reaches
from tests.fixtures.strangers import Strangers

KEY = b"k" * 32


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


@pytest.fixture
def listener() -> Iterator[ProbeListener]:
    with ProbeListener(KEY, 3, ["127.0.0.1"]) as it:
        yield it


def target(port: int, index: int = 3, address: str = "127.0.0.1") -> TaskInfo:
    return TaskInfo(
        index=index, host="b", port=0, interfaces=(("eth0", (address,)),), probe_port=port
    )


def test_idle_and_slow_strangers_held_open_do_not_change_the_verdict(listener) -> None:
    before = threading.active_count()
    strangers = Strangers("127.0.0.1", listener.port, idle=50, slow=50)
    try:
        wait_for(lambda: strangers.opened >= 100)
        # Every real probe meanwhile is answered, and proves the right task.
        for _ in range(20):
            assert probe([target(listener.port)], KEY) == {"eth0": [3]}
        assert not reaches("127.0.0.1", listener.port, 2, KEY, timeout=2.0)
        # The strangers were dropped (deadline, or pushed out) and came back, again and again.
        wait_for(lambda: listener.dropped > 100)
        wait_for(lambda: listener.answered >= 21)
    finally:
        strangers.stop()
    # One thread serves them all: none was started per connection.
    names = [t.name for t in threading.enumerate()]
    assert names.count("sparktrain-probe") == 1
    assert threading.active_count() <= before + 1


def test_pending_connections_are_bounded_and_the_oldest_goes_first() -> None:
    with ProbeListener(KEY, 0, ["127.0.0.1"], deadline=60.0, max_pending=4) as small:
        socks = [socket.create_connection(("127.0.0.1", small.port), timeout=5) for _ in range(10)]
        try:
            wait_for(lambda: small.dropped == 6)
            socks[0].settimeout(5)
            assert socks[0].recv(1) == b""  # the oldest was closed
            socks[-1].setblocking(False)
            with pytest.raises(BlockingIOError):
                socks[-1].recv(1)  # the newest is still held
            assert reaches("127.0.0.1", small.port, 0, KEY, timeout=2.0)
        finally:
            for sock in socks:
                sock.close()


def test_a_connection_that_never_sends_is_dropped_at_its_deadline() -> None:
    with ProbeListener(KEY, 0, ["127.0.0.1"], deadline=0.2) as quick:
        with socket.create_connection(("127.0.0.1", quick.port), timeout=5) as idle:
            idle.settimeout(5)
            assert idle.recv(1) == b""
        assert quick.dropped == 1


def test_the_listener_listens_only_on_the_addresses_it_is_given() -> None:
    with ProbeListener(KEY, 5, ["127.0.0.2", "127.0.0.3"]) as only:
        assert only.addresses == ["127.0.0.2", "127.0.0.3"]
        assert reaches("127.0.0.2", only.port, 5, KEY, timeout=2.0)
        assert reaches("127.0.0.3", only.port, 5, KEY, timeout=2.0)
        assert not reaches("127.0.0.1", only.port, 5, KEY, timeout=2.0)
    with ProbeListener(KEY, 5) as everywhere:
        assert everywhere.addresses == ["0.0.0.0"]


def test_a_probe_dropped_by_a_crowded_listener_is_tried_again() -> None:
    # A listener that drops the first connections unanswered (as a crowded one does), then
    # answers.
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            with conn:
                if len(accepted) <= 2:
                    continue
                challenge = conn.recv(16)
                conn.sendall(_answer(KEY, challenge, 3))

    threading.Thread(target=serve, daemon=True).start()
    try:
        assert probe([target(port)], KEY) == {"eth0": [3]}
        assert len(accepted) == 3  # dropped twice, answered the third time
    finally:
        server.close()


def test_a_link_that_accepts_and_never_answers_costs_one_timeout(monkeypatch) -> None:
    given: dict[int, list[float]] = {}
    real = probe_module._try

    def counted(address, port, index, key, timeout):
        given.setdefault(port, []).append(timeout)
        return real(address, port, index, key, timeout)

    monkeypatch.setattr(probe_module, "_try", counted)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; no answer
        dead = silent.getsockname()[1]
        with ProbeListener(KEY, 3, ["127.0.0.1"]) as alive:
            found = probe([target(alive.port), target(dead, index=4)], KEY, timeout=0.5)
            assert given[alive.port] == [0.5 * probe_module.TRY_SHARE]  # answered at once
    assert found == {"eth0": [3]}
    # The silent link was tried again within its window, never beyond it: one timeout.
    tries = given[dead]
    assert len(tries) > 1 and sum(tries) <= 0.5 + 0.01 * len(tries)
