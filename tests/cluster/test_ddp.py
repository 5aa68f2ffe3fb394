"""torch.distributed on two hosts: where each rank sits, and training that agrees."""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner
from tests.cluster.hosts import DECOY_ADDR, HOST_IF
from tests.fixtures import cluster_trainers

pytestmark = pytest.mark.cluster


def test_ddp_np4_on_two_hosts(cluster, cluster_spark):
    reports = SparkRunner(np=4).run(cluster_trainers.ddp_report, steps=5)
    host_of = {h.address: h.name for h in cluster.hosts.hosts}
    decoy = DECOY_ADDR.split("/")[0]

    assert [int(r["RANK"]) for r in reports] == [0, 1, 2, 3]
    by_host: dict[str, list[dict]] = {}
    for r in reports:
        # Each rank holds its host's address and the decoy one; nothing else.
        (own,) = [a for a in r["addresses"] if a in host_of]
        assert sorted(r["addresses"]) == sorted([own, decoy])
        by_host.setdefault(own, []).append(r)
    assert sorted(len(v) for v in by_host.values()) == [2, 2], "two ranks on each host"

    rank0_host = next(a for a, rs in by_host.items() if any(r["RANK"] == "0" for r in rs))
    for r in reports:
        assert r["MASTER_ADDR"] == rank0_host
        assert r["WORLD_SIZE"] == "4" and r["LOCAL_WORLD_SIZE"] == "2"
        # The interface that reaches the other host, not the decoy that sorts first.
        assert r["GLOO_SOCKET_IFNAME"] == HOST_IF and r["NCCL_SOCKET_IFNAME"] == HOST_IF
    for own, ranks in by_host.items():
        assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"]
        assert len({r["NODE_RANK"] for r in ranks}) == 1
        node = ranks[0]["NODE_RANK"]
        assert node == ("0" if own == rank0_host else "1")
        # Two executors on one host: distinct GPUs, each rank's own one first in line.
        devices = [r["CUDA_VISIBLE_DEVICES"] for r in ranks]
        assert all(sorted(d.split(",")) == ["0", "1"] for d in devices), devices
        for r in ranks:
            assert r["CUDA_VISIBLE_DEVICES"].split(",")[int(r["LOCAL_RANK"])] in ("0", "1")
        assert len({r["CUDA_VISIBLE_DEVICES"] for r in ranks}) == 1

    first = reports[0]["params"]
    assert all(r["params"] == first for r in reports), "DDP ranks disagree on the parameters"
