"""Choosing the network interface: the pure choice from what tasks reported and reached, the
probe listener's proof of identity, and Horovod's Gloo name check."""

from __future__ import annotations

import pytest

from sparktrain.backends.horovod import gloo_name_problem
from sparktrain.config import RunConfig
from sparktrain.errors import ConfigurationError
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec
from sparktrain.layout.interfaces import candidates, choose_interface, missing_nics, with_interface
from sparktrain.task.interface_probe import ProbeListener, probe, reaches

DECOY = ("docker0", ("198.19.0.1",))


def two_hosts(**extra) -> list[TaskInfo]:
    """Two tasks on each of two hosts; each host has eth0 and the same decoy docker0."""
    tasks = []
    for i, addr in enumerate(["198.18.1.11", "198.18.1.11", "198.18.1.12", "198.18.1.12"]):
        tasks.append(
            TaskInfo(
                index=i,
                host=addr,
                port=5000 + i,
                ifname="eth0",
                interfaces=(DECOY, ("eth0", (addr,))),
                probe_port=6000 + i,
                **extra,
            )
        )
    return tasks


def all_reach(tasks: list[TaskInfo], names: tuple[str, ...]) -> dict[int, dict[str, list[int]]]:
    """Every task reached every task of the other host on ``names``."""
    return {
        t.index: {n: [p.index for p in tasks if p.host != t.host] for n in names} for t in tasks
    }


def test_the_decoy_that_sorts_first_is_passed_over_for_the_executors_interface() -> None:
    tasks = two_hosts()
    assert candidates(tasks, None) == ["eth0", "docker0"]
    assert choose_interface(tasks, all_reach(tasks, ("eth0",)), None) == ("eth0", None)


def test_without_the_executors_interface_the_first_common_one_that_reaches_wins() -> None:
    tasks = [
        TaskInfo(
            index=i,
            host=h,
            port=1,
            ifname=own,
            interfaces=(("bond0", (a,)), ("ib0", (b,))),
            probe_port=7,
        )
        for i, (h, own, a, b) in enumerate(
            [("h1", "bond0", "10.0.0.1", "10.9.0.1"), ("h2", "ib0", "10.0.0.2", "10.9.0.2")]
        )
    ]
    # The executors' own interfaces differ by name: no preference, names in order.
    assert candidates(tasks, None) == ["bond0", "ib0"]
    reached = {0: {"ib0": [1]}, 1: {"ib0": [0], "bond0": [0]}}
    assert choose_interface(tasks, reached, None) == ("ib0", None)


def test_nics_are_tried_in_the_users_order() -> None:
    tasks = two_hosts()
    both = all_reach(tasks, ("eth0", "docker0"))
    assert choose_interface(tasks, both, ("docker0", "eth0")) == ("docker0", None)
    assert choose_interface(tasks, all_reach(tasks, ("eth0",)), ("docker0", "eth0"))[0] == "eth0"


def test_no_interface_reaching_every_host_names_each_hosts_interfaces_and_what_failed() -> None:
    tasks = two_hosts()
    # One direction of eth0 works, the other does not: still no common interface.
    reached = {0: {"eth0": [2, 3]}, 1: {"eth0": [2, 3]}, 2: {}, 3: {}}
    name, why = choose_interface(tasks, reached, None)
    assert name is None and why is not None
    assert "no network interface common to all hosts reaches every other host" in why
    assert "198.18.1.11: docker0 (198.19.0.1), eth0 (198.18.1.11)" in why
    assert "198.18.1.12: docker0 (198.19.0.1), eth0 (198.18.1.12)" in why
    assert "eth0: 198.18.1.12 could not reach 198.18.1.11's eth0 (198.18.1.11)" in why
    assert "docker0: 198.18.1.11 could not reach 198.18.1.12's docker0 (198.19.0.1)" in why
    assert "spark.sparktrain.nics" in why


def test_a_nics_interface_that_does_not_reach_is_named_in_the_error() -> None:
    tasks = two_hosts()
    name, why = choose_interface(tasks, all_reach(tasks, ("eth0",)), ("docker0",))
    assert name is None
    assert why is not None and why.startswith("none of nics=['docker0'] reaches every other host")


def test_a_nics_interface_missing_on_a_host_is_refused() -> None:
    tasks = two_hosts()
    assert missing_nics(tasks, ("eth0",)) is None
    assert missing_nics(tasks, ("ib9", "eth0")) is None  # one of them is enough
    why = missing_nics(tasks, ("ib0",))
    assert why is not None and "nics=['ib0']: host 198.18.1.11 has no such interface" in why


def test_the_chosen_interface_goes_to_every_task_and_the_master_address_onto_it() -> None:
    spec = build_cluster_spec(two_hosts())
    moved = with_interface(spec, "docker0")
    assert {r.task.ifname for r in moved.ranks} == {"docker0"}
    assert moved.master_addr == "198.19.0.1"
    assert with_interface(spec, "eth0").master_addr == "198.18.1.11"


def test_nics_is_a_setting_with_a_conf_key() -> None:
    assert RunConfig(np=2, nics="ib0, eth0").nics == ("ib0", "eth0")
    assert RunConfig(np=2, nics=["eth0"]).nics == ("eth0",)
    assert RunConfig(np=2, nics="").nics is None
    with pytest.raises(ConfigurationError, match="spark.sparktrain.nics"):
        RunConfig(np=2, nics=3)


def test_a_probe_is_answered_only_by_the_task_it_names() -> None:
    key = b"k" * 32
    with ProbeListener(key, index=3) as listener:
        assert reaches("127.0.0.1", listener.port, 3, key, timeout=2.0)
        # The same port answering for another task, or with another run's key, proves nothing.
        assert not reaches("127.0.0.1", listener.port, 2, key, timeout=2.0)
        assert not reaches("127.0.0.1", listener.port, 3, b"x" * 32, timeout=2.0)
    # Closed: nobody answers.
    assert not reaches("127.0.0.1", listener.port, 3, key, timeout=0.5)


def test_probe_tries_each_interface_of_each_target() -> None:
    key = b"k" * 32
    with ProbeListener(key, index=1) as peer:
        other = TaskInfo(
            index=1, host="b", port=1, interfaces=(("eth0", ("127.0.0.1",)),), probe_port=peer.port
        )
        # Its "docker0" address leads to another task's listener (as the same decoy address on
        # every host leads to this host's own): the answer does not prove task 3.
        decoy = TaskInfo(
            index=3,
            host="c",
            port=1,
            interfaces=(("docker0", ("127.0.0.1",)),),
            probe_port=peer.port,
        )
        reached = probe([other, decoy], key, timeout=1.0)
    assert reached == {"eth0": [1]}


def test_horovod_gloo_refuses_hosts_whose_name_resolves_to_loopback() -> None:
    fine = build_cluster_spec(
        [TaskInfo(index=i, host=f"10.0.0.{i}", port=1, name_address=f"10.0.0.{i}") for i in (0, 1)]
    )
    assert gloo_name_problem(fine) is None
    bad = build_cluster_spec(
        [
            TaskInfo(index=0, host="10.0.0.1", port=1, name_address="127.0.1.1"),
            TaskInfo(index=1, host="10.0.0.2", port=1, name_address=""),
        ]
    )
    why = gloo_name_problem(bad)
    assert why is not None
    assert "10.0.0.1: its name resolves to 127.0.1.1" in why
    assert "10.0.0.2: its name does not resolve" in why
    assert "launcher='mpi'" in why and "horovod_impl='builtin'" in why
    # One host: loopback joins its ranks.
    one = build_cluster_spec([TaskInfo(index=0, host="h", port=1, name_address="127.0.0.1")])
    assert gloo_name_problem(one) is None
