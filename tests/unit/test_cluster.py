"""build_cluster_spec: the pure mapping from gathered TaskInfos to ranks, table-driven."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from sparktrain.errors import SparkTrainError
from sparktrain.layout.cluster import ClusterSpec, TaskInfo, build_cluster_spec


def infos_of(hosts: list[str]) -> list[TaskInfo]:
    """Task ``i`` on ``hosts[i]``, offering port 5000 + i."""
    return [TaskInfo(index=i, host=h, port=5000 + i, pid=100 + i) for i, h in enumerate(hosts)]


# hosts of tasks 0..n-1 -> per global rank: (task index, host, local_rank, local_world_size,
# node_rank)
LAYOUTS: dict[str, tuple[list[str], list[tuple[int, str, int, int, int]]]] = {
    "one task": (["a"], [(0, "a", 0, 1, 0)]),
    "one host, three tasks": (
        ["a", "a", "a"],
        [(0, "a", 0, 3, 0), (1, "a", 1, 3, 0), (2, "a", 2, 3, 0)],
    ),
    "two hosts, one task each": (["a", "b"], [(0, "a", 0, 1, 0), (1, "b", 0, 1, 1)]),
    "two hosts interleaved by task index": (
        ["a", "b", "a", "b"],
        [(0, "a", 0, 2, 0), (2, "a", 1, 2, 0), (1, "b", 0, 2, 1), (3, "b", 1, 2, 1)],
    ),
    # a=0,3  b=1  c=2,4,5: 2, 1 and 3 tasks, interleaved.
    "three hosts with 2,1,3 tasks": (
        ["a", "b", "c", "a", "c", "c"],
        [
            (0, "a", 0, 2, 0),
            (3, "a", 1, 2, 0),
            (1, "b", 0, 1, 1),
            (2, "c", 0, 3, 2),
            (4, "c", 1, 3, 2),
            (5, "c", 2, 3, 2),
        ],
    ),
    # Node order follows each host's lowest task index, not the host name.
    "host names not in node order": (
        ["zeta", "alpha", "zeta", "mid", "alpha"],
        [
            (0, "zeta", 0, 2, 0),
            (2, "zeta", 1, 2, 0),
            (1, "alpha", 0, 2, 1),
            (4, "alpha", 1, 2, 1),
            (3, "mid", 0, 1, 2),
        ],
    ),
}


def _check_layout(
    spec: ClusterSpec, hosts: list[str], expected: list[tuple[int, str, int, int, int]]
) -> None:
    got = [
        (r.task.index, r.task.host, r.local_rank, r.local_world_size, r.node_rank)
        for r in spec.ranks
    ]
    assert got == expected
    assert [r.rank for r in spec.ranks] == list(range(len(hosts)))
    assert spec.world_size == len(hosts)
    assert spec.num_nodes == len(set(hosts))
    # Task 0 is rank 0 and offers the master address and port.
    assert spec.ranks[0].task.index == 0
    assert spec.for_task(0).rank == 0
    assert (spec.master_addr, spec.master_port) == (hosts[0], 5000)
    # Ranks are contiguous per host, local ranks 0..k-1 in rank order, one node rank each.
    for host, count in spec.hosts():
        on_host = spec.on_host(host)
        assert len(on_host) == count
        ranks = [r.rank for r in on_host]
        assert ranks == list(range(ranks[0], ranks[0] + count))
        assert [r.local_rank for r in on_host] == list(range(count))
        assert {r.local_world_size for r in on_host} == {count}
        assert len({r.node_rank for r in on_host}) == 1
        # Inside a host, ranks follow task index.
        assert [r.task.index for r in on_host] == sorted(r.task.index for r in on_host)
    assert [spec.on_host(h)[0].node_rank for h, _ in spec.hosts()] == list(range(spec.num_nodes))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout(name: str) -> None:
    hosts, expected = LAYOUTS[name]
    _check_layout(build_cluster_spec(infos_of(hosts)), hosts, expected)


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_layout_does_not_depend_on_gather_order(name: str, seed: int) -> None:
    hosts, expected = LAYOUTS[name]
    infos = infos_of(hosts)
    random.Random(seed).shuffle(infos)
    spec = build_cluster_spec(infos)
    _check_layout(spec, hosts, expected)
    assert spec == build_cluster_spec(infos_of(hosts))


def test_reversed_input() -> None:
    hosts = ["a", "b", "a", "b"]
    spec = build_cluster_spec(list(reversed(infos_of(hosts))))
    assert spec == build_cluster_spec(infos_of(hosts))
    assert spec.master_port == 5000


def test_for_task_and_hosts() -> None:
    spec = build_cluster_spec(infos_of(["a", "b", "c", "a", "c", "c"]))
    assert [spec.for_task(i).rank for i in range(6)] == [0, 2, 3, 1, 4, 5]
    assert spec.hosts() == [("a", 2), ("b", 1), ("c", 3)]
    assert spec.on_host("nowhere") == []
    with pytest.raises(KeyError, match="no rank for task 6"):
        spec.for_task(6)


def test_task_info_travels_with_its_rank() -> None:
    infos = [
        TaskInfo(index=0, host="10.0.0.1", port=6000, gpus=("3",), cpus=4, pid=11, ifname="eth0"),
        TaskInfo(index=1, host="10.0.0.2", port=6001, gpus=("0", "1"), cpus=2, pid=12),
    ]
    spec = build_cluster_spec(infos)
    assert spec.for_task(0).task == infos[0]
    assert spec.for_task(1).task == infos[1]
    assert (spec.master_addr, spec.master_port) == ("10.0.0.1", 6000)


@pytest.mark.parametrize(
    "indices",
    [[], [1], [0, 0], [0, 2], [1, 2], [0, 1, 1], [-1, 0], [0, 1, 3]],
    ids=repr,
)
def test_bad_index_sets_raise(indices: list[int]) -> None:
    infos = [TaskInfo(index=i, host="a", port=1) for i in indices]
    with pytest.raises(SparkTrainError, match="rendezvous got task indices"):
        build_cluster_spec(infos)


@pytest.mark.parametrize(
    "info",
    [
        TaskInfo(index=0, host="h", port=1),
        TaskInfo(
            index=7,
            host="fe80::1",
            port=65535,
            gpus=("0", "GPU-abc"),
            cpus=8,
            pid=4242,
            ifname="ens5",
        ),
    ],
)
def test_task_info_json_round_trip(info: TaskInfo) -> None:
    text = info.to_json()
    data = json.loads(text)
    assert data["gpus"] == list(info.gpus)  # a JSON list, not a tuple repr
    assert TaskInfo.from_json(text) == info
    assert TaskInfo.from_json(data) == info  # an already-parsed mapping works too


def test_task_info_from_json_defaults_and_coercion() -> None:
    info = TaskInfo.from_json({"index": "2", "host": "h", "port": "80", "gpus": [0, 1]})
    assert info == TaskInfo(index=2, host="h", port=80, gpus=("0", "1"), cpus=1, pid=0, ifname=None)


def test_specs_are_immutable() -> None:
    spec = build_cluster_spec(infos_of(["a"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.master_port = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.ranks[0].task.index = 3  # type: ignore[misc]
