"""Choosing the network interface on two hosts whose decoy docker0 (the same address on both,
reaching nothing) sorts before eth0: probed, not guessed; ``nics`` overrides, and one that
does not reach is an error at rendezvous, not a hang."""

from __future__ import annotations

import functools
import time
import uuid

import pytest

from sparktrain import SparkRunner
from sparktrain.errors import ConfigurationError
from tests.cluster.hosts import DECOY_ADDR, DECOY_IF, HOST_DISK, HOST_IF
from tests.fixtures import cluster_trainers, nic_trainers

pytestmark = pytest.mark.cluster


def test_the_probe_passes_over_a_decoy_the_user_put_first(cluster, cluster_spark):
    # docker0 exists on every host, so only a probe can tell that it joins none of them.
    reports = SparkRunner(np=4, nics=[DECOY_IF, HOST_IF]).run(cluster_trainers.ddp_report, steps=1)
    addresses = {h.address for h in cluster.hosts.hosts}
    for r in reports:
        assert DECOY_ADDR.split("/")[0] in r["addresses"]  # the decoy is there, and up
        assert r["GLOO_SOCKET_IFNAME"] == HOST_IF and r["NCCL_SOCKET_IFNAME"] == HOST_IF
        assert r["MASTER_ADDR"] in addresses
    assert all(r["params"] == reports[0]["params"] for r in reports)


def test_nics_eth0_runs_across_hosts(cluster, cluster_spark):
    reports = SparkRunner(np=4, nics=HOST_IF).run(cluster_trainers.ddp_report, steps=1)
    assert {r["GLOO_SOCKET_IFNAME"] for r in reports} == {HOST_IF}
    assert len({r["MASTER_ADDR"] for r in reports}) == 1
    assert all(r["params"] == reports[0]["params"] for r in reports)


def test_nics_that_reaches_no_other_host_is_an_error_at_rendezvous(cluster, cluster_spark):
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as raised:
        SparkRunner(np=4, nics=DECOY_IF, start_timeout=120).run(
            cluster_trainers.ddp_report, steps=1
        )
    took = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith(f"none of nics=['{DECOY_IF}'] reaches every other host")
    for host in cluster.hosts.hosts:
        # Each host's interfaces, and the link that failed.
        assert f"{host.address}: {DECOY_IF} ({DECOY_ADDR.split('/')[0]}), {HOST_IF} " in message
        assert f"could not reach {host.address}'s {DECOY_IF}" in message
    assert "spark.sparktrain.nics" in message
    print(f"nics={DECOY_IF} refused after {took:.1f}s (start_timeout 120 s)")


def test_nics_that_no_host_has_is_named_before_any_rank_starts(cluster, cluster_spark):
    with pytest.raises(ConfigurationError) as raised:
        SparkRunner(np=4, nics="ib0").run(cluster_trainers.ddp_report, steps=1)
    message = str(raised.value)
    net = cluster.hosts.gateway.rsplit(".", 1)[0] + "."  # the tier's /24, e.g. 198.18.1.
    assert f"nics=['ib0']: host {net}" in message and "has no such interface" in message
    assert f"{DECOY_IF} ({DECOY_ADDR.split('/')[0]}), {HOST_IF} ({net}" in message


def test_strangers_at_every_probe_port_do_not_change_the_interface_choice(cluster, cluster_spark):
    # 50 connections that never send and 50 that send a byte every 0.2 s, opened again as
    # soon as they are dropped, at every task's probe listener, all connected before the task
    # says hello (so before any probe) and held until its listener closes; the decoy is put
    # first, so only the probes can tell it from eth0.
    folder = str(HOST_DISK / f"strangers-{uuid.uuid4().hex[:8]}")
    runner = SparkRunner(np=4, nics=[DECOY_IF, HOST_IF])
    runner._pre_rendezvous_hook = functools.partial(nic_trainers.haunt_probe_port, folder=folder)
    reports = runner.run_all(nic_trainers.ddp_with_strangers, folder)
    assert [r["GLOO_SOCKET_IFNAME"] for r in reports] == [HOST_IF] * 4
    assert all(r["sum"] == 4 for r in reports)
    # Every task's probe listener had its 100 strangers, or more (each rank sees the two
    # tasks of its host; its host's disk holds their counts).
    for r in reports:
        assert len(r["strangers"]) == 2 and min(r["strangers"]) >= 100, reports
