"""Where the run's servers listen: the one address their peers use, when it is this machine's."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from sparktrain import wire
from sparktrain.driver.places import place_for
from sparktrain.wire.address import choose_listen_address, listen_address, local_addresses

LOCAL = {"127.0.0.1", "::1", "10.1.2.3", "fe80::1", "2001:db8::5"}


@pytest.mark.parametrize(
    ("host", "resolved", "expected"),
    [
        # An address of this machine, as a literal or a name: listen there alone.
        ("10.1.2.3", ["10.1.2.3"], "10.1.2.3"),
        ("driver.example", ["10.1.2.3"], "10.1.2.3"),
        ("driver.example", ["10.1.2.3", "10.1.2.3"], "10.1.2.3"),  # one per socket type
        ("2001:db8::5", ["2001:db8::5"], "2001:db8::5"),
        ("[2001:db8::5]", ["2001:db8::5"], "2001:db8::5"),
        # Loopback literals are what the peers use (local runs, one-machine clusters).
        ("127.0.0.1", ["127.0.0.1"], "127.0.0.1"),
        ("127.0.0.2", ["127.0.0.2"], "127.0.0.2"),  # all of 127/8 is this machine's
        ("::1", ["::1"], "::1"),
        # A name that resolves to loopback here may not elsewhere (Debian's 127.0.1.1).
        ("driver.example", ["127.0.1.1"], "FALLBACK"),
        ("localhost", ["127.0.0.1"], "FALLBACK"),
        # Not this machine's (NAT, a container's published address): where it would have.
        ("203.0.113.7", ["203.0.113.7"], "FALLBACK"),
        ("driver.example", ["203.0.113.7"], "FALLBACK"),
        # Several addresses: one socket cannot listen on them all, peers may use any.
        ("driver.example", ["10.1.2.3", "2001:db8::5"], "FALLBACK"),
        ("localhost", ["127.0.0.1", "::1"], "FALLBACK"),
        # Unresolvable, or link-local (which needs a scope to bind).
        ("nowhere.invalid", [], "FALLBACK"),
        ("fe80::1", ["fe80::1"], "FALLBACK"),
        ("driver.example", ["not an address"], "FALLBACK"),
    ],
)
def test_choose_listen_address(host: str, resolved: list[str], expected: str) -> None:
    assert choose_listen_address(host, resolved, LOCAL, "FALLBACK") == expected


def test_listen_address_on_this_machine() -> None:
    assert listen_address("127.0.0.1", "") == "127.0.0.1"
    assert listen_address("192.0.2.10", "0.0.0.0") == "0.0.0.0"  # TEST-NET-1: nobody's
    assert listen_address("nowhere.invalid", "") == ""
    routable = sorted(a for a in local_addresses() if ":" not in a and not a.startswith("127."))
    if routable:
        assert listen_address(routable[0], "") == routable[0]


def test_a_server_listens_on_that_address_alone() -> None:
    srv = wire.FrameServer(b"k" * 32, lambda conn_id, message: None, bind="127.0.0.2")
    try:
        assert srv.address == f"127.0.0.2:{srv.port}"
        socket.create_connection(("127.0.0.2", srv.port), timeout=5).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
    finally:
        srv.close()


def fake_session(conf: dict[str, str]) -> Any:
    spark_conf = SimpleNamespace(get=lambda key, default=None: conf.get(key, default))
    return SimpleNamespace(sparkContext=SimpleNamespace(getConf=lambda: spark_conf))


def test_the_channel_listens_on_the_driver_host_when_it_is_this_machine() -> None:
    assert place_for(None).channel_address() == ("127.0.0.1", "127.0.0.1")
    session = fake_session({"spark.driver.host": "127.0.0.1"})
    assert place_for(session).channel_address() == ("127.0.0.1", "127.0.0.1")
    # spark.driver.host is an address this machine does not hold: where Spark's driver listens.
    session = fake_session({"spark.driver.host": "192.0.2.10"})
    assert place_for(session).channel_address() == ("0.0.0.0", "192.0.2.10")
    session = fake_session(
        {"spark.driver.host": "192.0.2.10", "spark.driver.bindAddress": "127.0.0.1"}
    )
    assert place_for(session).channel_address() == ("127.0.0.1", "192.0.2.10")
