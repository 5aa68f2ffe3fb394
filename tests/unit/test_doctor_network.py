"""The doctor's network row for an executor Spark knows by a loopback address
(``SPARK_LOCAL_IP=127.0.0.1``, a master on this machine): the loopback interface carries
the ranks' traffic, as in a run, and nothing is to be fixed."""

from __future__ import annotations

import socket
import sys

import pytest

from sparktrain.commands import doctor_host
from sparktrain.commands.doctor_cluster import host_checks
from sparktrain.commands.doctor_probes import OK, WARN

DRIVER = dict(doctor_host.versions())
# What interfaces() lists on such a host: loopback is left out of the listing.
FOUND = {"eth0": ["192.0.2.2"]}


def report(host: str, chosen: str | None) -> dict:
    return {
        "index": 0,
        "host": host,
        "executor": f"{host}:45000",
        "versions": DRIVER,
        "gpus": [],
        "interfaces": FOUND,
        "chosen": chosen,
    }


@pytest.fixture
def without_sparktrain_there(monkeypatch):
    """The executor's Python cannot import sparktrain (another interpreter): the probe
    answers from what it lists itself."""
    monkeypatch.setitem(sys.modules, "sparktrain.task.entry", None)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_loopback_executor_uses_the_loopback_interface(host, without_sparktrain_there):
    chosen = doctor_host.chosen_interface(host, FOUND)
    loopback = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    assert chosen == loopback[0]
    [_, _, network] = host_checks([report("127.0.0.1", chosen)], DRIVER)
    assert network.status == OK
    assert network.detail == f"eth0 192.0.2.2; sparktrain uses {chosen}"
    assert not network.fix


def test_the_probe_agrees_with_what_a_run_uses(without_sparktrain_there, monkeypatch):
    fallback = doctor_host.chosen_interface("127.0.0.1", FOUND)
    monkeypatch.delitem(sys.modules, "sparktrain.task.entry")
    from sparktrain.task.entry import interface_of

    assert fallback == interface_of("127.0.0.1") == doctor_host.chosen_interface("127.0.0.1", FOUND)


def test_an_address_no_interface_holds_is_still_a_warning(without_sparktrain_there):
    chosen = doctor_host.chosen_interface("198.18.7.7", FOUND)
    assert chosen is None
    [_, _, network] = host_checks([report("198.18.7.7", chosen)], DRIVER)
    assert network.status == WARN and network.detail.endswith("uses none")
    assert "SPARK_LOCAL_IP" in network.fix
