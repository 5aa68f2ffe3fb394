"""The rendezvous in O(N): each task's ``go`` against the whole layout, table-driven with fake
multi-host inputs; frame sizes at 10,000 tasks; the probe plan; the driver's vote per host."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from sparktrain import contract
from sparktrain.backends import get_backend
from sparktrain.backends.base import rank_env
from sparktrain.backends.horovod import horovod_slot, horovod_slots
from sparktrain.config import RunConfig
from sparktrain.driver.layout import InterfaceVote
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec
from sparktrain.layout.rendezvous import (
    FULL_MESH_HOSTS,
    GoAssembler,
    go_messages,
    plan,
    probe_plan,
    probe_targets,
    view_of,
)
from sparktrain.task.mpi import command
from sparktrain.wire import MAX_FRAME, protocol


def tasks_on(hosts: Sequence[str], per_task: int = 1, probe_port: int = 0) -> list[TaskInfo]:
    """One Spark task per entry of ``hosts``, each with ``per_task`` slots (one GPU each)."""
    infos = []
    for partition, host in enumerate(hosts):
        for slot in range(per_task):
            infos.append(
                TaskInfo(
                    index=partition * per_task + slot,
                    host=host,
                    port=7000 + partition if slot == 0 else 0,
                    gpus=(str(slot),),
                    gpu_uuids=(f"GPU-{host}-{partition}-{slot}",),
                    interfaces=(("eth0", (host,)), ("ib0", (f"10.9.{partition}.{slot}",))),
                    probe_port=probe_port,
                    slot=slot,
                )
            )
    return infos


def task_slots(tasks: Sequence[TaskInfo]) -> list[list[int]]:
    """The slots each Spark task speaks for (one connection each)."""
    groups: dict[int, list[int]] = {}
    for t in tasks:
        groups.setdefault(t.first_index, []).append(t.index)
    return list(groups.values())


def go_of(layout, slots: Sequence[int]) -> dict:
    assembler = GoAssembler()
    done = [assembler.add(m) for m in go_messages(layout, slots)]
    assert done[-1] and not any(done[:-1])
    assert assembler.go is not None
    return assembler.go


LAYOUTS = {
    "one host": (["a", "a", "a"], 1),
    "two hosts": (["a", "a", "b", "b"], 1),
    "uneven hosts, interleaved": (["a", "b", "c", "a", "c", "c"], 1),
    "one rank per host": (["a", "b", "c", "d"], 1),
    "two GPUs per task": (["a", "b", "a"], 2),
}


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_each_task_sees_what_the_whole_layout_gives_its_ranks(name: str, backend: str) -> None:
    hosts, per_task = LAYOUTS[name]
    tasks = tasks_on(hosts, per_task)
    whole = build_cluster_spec(tasks)
    layout = plan(tasks)
    config = RunConfig(np=len(tasks), backend=backend, horovod_impl="builtin")
    shared = {contract.HOROVOD_SHIM_ENV: "builtin"}
    for slots in task_slots(tasks):
        view = view_of(go_of(layout, slots)).spec
        host = whole.for_task(slots[0]).task.host
        # Its host's ranks, exactly as the whole layout has them; not another host's.
        assert view.ranks == tuple(whole.on_host(host))
        assert (view.world_size, view.num_nodes) == (whole.world_size, whole.num_nodes)
        assert (view.master_addr, view.master_port, view.first) == (
            whole.master_addr,
            whole.master_port,
            whole.ranks[0],
        )
        assert view.node_sizes == (whole.node_sizes if 0 in slots else ())
        for rank in view.ranks:
            # Every variable a rank gets is what it would get from the whole layout.
            assert rank_env(view, rank, config) == rank_env(whole, rank, config)
            got = get_backend(backend).env(view, rank, shared, config)
            assert got == get_backend(backend).env(whole, rank, shared, config)
            assert horovod_slot(view, rank) == horovod_slots(whole)[rank.rank]


def test_horovods_rendezvous_plan_is_made_on_rank_0s_task_from_its_view() -> None:
    tasks = tasks_on(["a", "b", "c", "a", "c", "c"])
    whole = build_cluster_spec(tasks)
    view = view_of(go_of(plan(tasks), [0])).spec
    assert len(view.ranks) == 2  # its host's ranks only
    assert horovod_slots(view) == horovod_slots(whole)


def test_the_local_supervisor_speaking_for_every_slot_sees_the_whole_layout() -> None:
    tasks = tasks_on(["a", "b", "a", "c"])
    view = view_of(go_of(plan(tasks), range(4))).spec
    assert view == build_cluster_spec(tasks)
    assert view.complete


def test_under_mpi_only_rank_0s_task_gets_every_rank() -> None:
    tasks = tasks_on(["a", "a", "b", "b", "c"])
    whole = build_cluster_spec(tasks)
    layout = plan(tasks, whole_for_rank0=True)
    views = {s[0]: view_of(go_of(layout, s)).spec for s in task_slots(tasks)}
    assert views[0] == whole
    # The launcher's peers are found from its view; a member serves its own host only.
    assert command.hosts_needing_daemons(views[0]) == ["b", "c"]
    assert command.hosts_needing_daemons(views[2]) == ["b"]
    assert command.first_task_on(views[2], "b") == 2
    assert command.hosts_needing_daemons(views[1]) == []
    assert [r.task.host for r in views[4].ranks] == ["c"]


def test_probe_targets_are_every_other_host_then_a_sample_that_crosses_every_cut() -> None:
    assert probe_targets(3, 1) == [0, 2]
    assert len(probe_targets(FULL_MESH_HOSTS, 0)) == FULL_MESH_HOSTS - 1
    for hosts in (FULL_MESH_HOSTS + 1, 256, 1250):
        targets = probe_plan(hosts)
        probed_by = [0] * hosts
        for node, mine in targets.items():
            assert node not in mine and len(mine) == len(set(mine))
            assert (node + 1) % hosts in mine  # the ring: every cut is crossed
            for other in mine:
                probed_by[other] += 1
        # Each host probes and is probed by the same few: O(log hosts), not O(hosts).
        assert len(set(probed_by)) == 1
        assert probed_by[0] == len(targets[0]) <= 8 + hosts.bit_length()
    assert sum(len(t) for t in probe_plan(256).values()) == 256 * 12


def test_only_each_hosts_prober_probes_and_its_targets_are_the_other_hosts_probers() -> None:
    tasks = tasks_on(["a", "a", "b", "b", "c"], per_task=2, probe_port=9)
    layout = plan(tasks)
    assert layout.probers == (0, 4, 8)
    probes = {s[0]: view_of(go_of(layout, s)) for s in task_slots(tasks)}
    assert all(v.probing for v in probes.values())
    assert [t.index for t in probes[0].probe] == [4, 8]
    assert [t.index for t in probes[4].probe] == [0, 8]
    assert probes[2].probe == () and probes[6].probe == ()
    # Without a probe listener everywhere, or on one host, nothing is probed.
    assert not plan(tasks_on(["a", "b"])).probing
    assert not plan(tasks_on(["a", "a"], probe_port=9)).probing


def test_every_frame_fits_at_10000_tasks_and_the_driver_sends_o_n_bytes() -> None:
    n = 10_000
    names = [f"198.18.{h // 250}.{h % 250}" for h in range(n // 8)]
    tasks = tasks_on([names[i // 8] for i in range(n)], probe_port=9)
    layout = plan(tasks)
    sizes = [
        len(json.dumps(message))
        for slots in task_slots(tasks)
        for message in go_messages(layout, slots)
    ]
    assert max(sizes) < MAX_FRAME - 4096  # room for the frame's envelope
    # 8 ranks per host: each go holds 8 entries, rank 0 and a dozen probe targets.
    assert sum(sizes) / n < 16 * 1024
    # One connection for every slot (the local supervisor): split in frames, joined whole.
    whole = go_messages(layout, range(n))
    assert len(whole) > 1 and all(len(json.dumps(m)) < MAX_FRAME - 4096 for m in whole)
    assert [m["type"] for m in whole[:-1]] == [protocol.LAYOUT.name] * (len(whole) - 1)
    assert view_of(go_of(layout, range(n))).spec.complete


def test_the_vote_waits_for_each_hosts_prober_and_ignores_other_tasks() -> None:
    tasks = tasks_on(["a", "a", "b", "b"], probe_port=9)
    layout = plan(tasks)
    vote = InterfaceVote(layout, None)
    assert vote.add(1, {"eth0": [0, 2]}) is None  # not a prober: not asked
    assert vote.add(0, {"eth0": [2], "ib0": [2]}) is None
    assert vote.add(2, {"eth0": [0]}) == ("eth0", None)


def test_a_dead_interface_on_every_host_of_a_sampled_layout_is_passed_over() -> None:
    names = [f"198.18.0.{h}" for h in range(40)]
    tasks = tasks_on([h for h in names for _ in range(8)], probe_port=9)
    layout = plan(tasks)
    targets = probe_plan(40)
    vote = InterfaceVote(layout, ("ib0", "eth0"))
    answers = []
    for node, prober in enumerate(layout.probers):
        reached = {"eth0": [layout.probers[t] for t in targets[node]]}  # ib0 reaches nothing
        answers.append(vote.add(prober, reached))
    assert answers[:-1] == [None] * 39 and answers[-1] == ("eth0", None)


def test_one_host_unreachable_on_every_interface_is_named_clearly() -> None:
    names = [f"198.18.0.{h}" for h in range(20)]
    tasks = tasks_on(names, probe_port=9)
    layout = plan(tasks)
    vote = InterfaceVote(layout, None)
    targets = probe_plan(20)
    answer = None
    for node, prober in enumerate(layout.probers):
        reached = [layout.probers[t] for t in targets[node] if t != 7]
        answer = vote.add(prober, {"eth0": reached})  # ib0 reaches nothing
    assert answer is not None and answer[0] is None
    why = str(answer[1])
    assert "no network interface common to all hosts reaches every other host" in why
    assert "198.18.0.6 could not reach 198.18.0.7's eth0 (198.18.0.7)" in why
    assert "198.18.0.7: eth0 (198.18.0.7), ib0 (10.9.7.0)" in why
    # A long list is cut, with a count: ib0 failed on all 20 x 9 links.
    assert "; and 168 more" in why
    assert "spark.sparktrain.nics" in why


def test_the_driver_sends_each_task_its_hosts_part_and_chooses_from_the_probers(
    tmp_path,
) -> None:
    # 32 tasks on 4 hosts speak the real protocol to the real monitor over real sockets.
    import threading

    from sparktrain import wire
    from sparktrain.driver.channel import ChannelServer
    from sparktrain.driver.monitor import RunMonitor
    from tests.unit.test_monitor import FakeLaunch

    n, hosts = 32, ["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"]
    infos = tasks_on([hosts[i // 8] for i in range(n)], probe_port=9)
    got: dict[int, dict] = {}
    chosen: dict[int, str] = {}

    def body(tasks, done) -> None:
        def one(task) -> None:
            info = infos[task.index]
            task.client.send(protocol.HELLO(index=task.index, info=info.as_dict()))
            assembler = GoAssembler()
            while not assembler.add(task.client.receive()):
                pass
            go = got[task.index] = assembler.go
            view = view_of(go)
            if view.probe:  # this host's prober: every other host reached on eth0 only
                reached = {"eth0": [t.index for t in view.probe]}
                task.client.send(protocol.PROBED(index=task.index, reached=reached))
            message = task.client.receive()
            chosen[task.index] = message.get("ifname", message["type"])
            task.client.send(protocol.EXITED(index=task.index))

        threads = [threading.Thread(target=one, args=(t,)) for t in tasks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        done([{"index": i, "rank": i, "status": "ok", "result": None} for i in range(n)], None)

    with ChannelServer(wire.new_key()) as server:
        config = RunConfig(np=n, grace_period=1, nics=["ib0", "eth0"])
        records = RunMonitor(config, server).watch(FakeLaunch(server, n, body))
    assert len(records) == n
    assert chosen == {i: "eth0" for i in range(n)}
    whole = build_cluster_spec(infos)
    for index, go in got.items():
        view = view_of(go)
        assert view.spec.ranks == tuple(whole.on_host(infos[index].host))
        assert bool(view.probe) == (index % 8 == 0)  # one prober per host
