"""The rendezvous in O(N): the driver maps every task to ranks once, and tells each task only
what it needs (pure functions, on the driver and in a task alike).

Once every task has said hello, the driver computes the whole layout with
:func:`~sparktrain.layout.cluster.build_cluster_spec` (:func:`plan`) and sends each connection one
``go`` (:func:`go_messages`), sized by the ranks of its own host, not by the job:

* ``world_size``, ``num_nodes``, ``num_hosts``: the job's size, in ranks, nodes and hosts;
* ``nodes``: what a node is (``"host"`` or ``"task"``, see :func:`~sparktrain.layout.cluster.node_rule`);
* ``master_addr``, ``master_port``: rank 0's host and the port its task offered;
* ``first``: rank 0's entry (a rank entry, below): where its task runs and on which
  interfaces (the master's address moves to the chosen interface);
* ``ranks``: a rank entry for every rank on the hosts of the slots this connection speaks
  for (a Spark task: its host; the local supervisor: every rank), or for every rank of the
  job where a task needs the whole layout (rank 0's task under ``launcher="mpi"``, which
  runs mpirun for every host);
* ``host_nodes``: ``[[host, [ranks of each of its nodes, ...]], ...]`` for every host in
  node order, to rank 0's task only (Horovod's rendezvous server is sized by it, and the
  nodes' names follow from it: O(hosts + nodes) small numbers); ``[]`` elsewhere;
* ``probing``: whether the interface is chosen by probes (the ranks span hosts and every
  task listens for probes): every task then waits for ``chosen``;
* ``probe``: the tasks this connection's task probes, ``[{"index", "host", "port",
  "probe_port", "interfaces"}, ...]``: the prober of each host it samples (see
  :func:`probe_targets`); ``[]`` for a task that is not its host's prober. A prober sends
  ``probed`` (interface name -> indices of the probed tasks that answered) once.

A rank entry is ``{"rank", "local_rank", "local_world_size", "node_rank", "host_rank",
"host_local_rank", "host_local_size", "cross_rank", "cross_size", "task"}``, its ``task`` a TaskInfo as JSON. Where the entries of one ``go``
would not fit a frame, ``layout`` messages (``ranks``: a list of rank entries) come first on
the same connection, and the ``go`` carries the rest: a task joins them in order
(:class:`GoAssembler`); :func:`view_of` turns a whole ``go`` into the task's
:class:`~sparktrain.layout.cluster.ClusterSpec` and its probe targets.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sparktrain.errors import SparkTrainError
from sparktrain.layout.cluster import ClusterSpec, RankSpec, TaskInfo, build_cluster_spec
from sparktrain.wire import protocol

# Up to this many hosts every host's prober probes every other host (O(hosts²) probes, at
# most 240 here); beyond, each probes a sample (see probe_targets).
FULL_MESH_HOSTS = 16
# The bytes of rank entries one frame carries at most (MAX_FRAME is 1 MiB; the rest of the
# message and the frame's envelope fit in what is left).
FRAME_BUDGET = 512 * 1024


@dataclasses.dataclass(frozen=True)
class Layout:
    """The job's layout, computed once on the driver.

    Attributes:
        spec: the whole ClusterSpec.
        probers: by host rank, the index of the task that probes for that host (its lowest).
        probing: whether the interface is chosen by probes.
        whole_for_rank0: whether rank 0's task is sent every rank (``launcher="mpi"``).
    """

    spec: ClusterSpec
    probers: tuple[int, ...]
    probing: bool
    whole_for_rank0: bool = False
    rank_by_index: Mapping[int, int] = dataclasses.field(default_factory=dict)
    # Each rank's entry and its size in JSON, made once for all the tasks of its host.
    _entries: dict[int, tuple[dict[str, Any], int]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def entry(self, rank: RankSpec) -> tuple[dict[str, Any], int]:
        """``rank``'s entry in a ``go`` (:func:`rank_entry`) and its size in JSON."""
        found = self._entries.get(rank.rank)
        if found is None:
            made = rank_entry(rank)
            found = self._entries[rank.rank] = (made, len(json.dumps(made)))
        return found

    def rank_of(self, index: int) -> int:
        """The rank of task ``index``."""
        return self.rank_by_index[index]

    def prober_tasks(self) -> list[TaskInfo]:
        """Each host's prober, in node order."""
        return [self.spec.ranks[self.rank_of(i)].task for i in self.probers]


def plan(
    tasks: Sequence[TaskInfo],
    whole_for_rank0: bool = False,
    node: str = "auto",
    use_gpu: bool | None = None,
) -> Layout:
    """The layout of ``tasks`` (every task's hello), with its probers.

    Args:
        tasks: one TaskInfo per slot, indices 0 .. n-1.
        whole_for_rank0: send rank 0's task every rank (it launches every host's ranks).
        node: the ``node`` setting (see :func:`~sparktrain.layout.cluster.node_rule`).
        use_gpu: the ``use_gpu`` setting.
    """
    spec = build_cluster_spec(tasks, node, use_gpu)
    # A host's prober is the task of its first rank (ranks follow task index on a host).
    probers = tuple(r.task.first_index for r in spec.ranks if r.host_local_rank == 0)
    probing = spec.num_hosts > 1 and all(r.task.probe_port for r in spec.ranks)
    by_index = {r.task.index: r.rank for r in spec.ranks}
    return Layout(spec, probers, probing, whole_for_rank0, by_index)


def _host_ranks(spec: ClusterSpec, first: RankSpec) -> Sequence[RankSpec]:
    """The ranks of ``first``'s host, ``first`` being its first rank (ranks are contiguous)."""
    return spec.ranks[first.rank : first.rank + first.host_local_size]


def probe_targets(num_hosts: int, host: int) -> list[int]:
    """The hosts (host ranks) that host ``host``'s prober probes.

    Every other host while there are at most :data:`FULL_MESH_HOSTS`; beyond, the next 8
    hosts round the ring and those 16, 32, 64, ... ahead: each host probes and is probed
    by O(log hosts) others, every cut of the hosts into two groups is crossed by some probe
    (the ring), and a dead interface is seen from every host. A link between two hosts
    outside the sample is not tested.
    """
    if num_hosts <= FULL_MESH_HOSTS:
        return [h for h in range(num_hosts) if h != host]
    steps = list(range(1, 9))
    step = 16
    while step < num_hosts:
        steps.append(step)
        step *= 2
    return sorted({(host + s) % num_hosts for s in steps} - {host})


def probe_plan(num_hosts: int) -> dict[int, list[int]]:
    """Every host's probe targets (see :func:`probe_targets`), by host rank."""
    return {host: probe_targets(num_hosts, host) for host in range(num_hosts)}


def rank_entry(rank: RankSpec) -> dict[str, Any]:
    """One rank of a ``go`` as JSON."""
    return {
        "rank": rank.rank,
        "local_rank": rank.local_rank,
        "local_world_size": rank.local_world_size,
        "node_rank": rank.node_rank,
        "host_rank": rank.host_rank,
        "host_local_rank": rank.host_local_rank,
        "host_local_size": rank.host_local_size,
        "cross_rank": rank.cross_rank,
        "cross_size": rank.cross_size,
        "task": rank.task.as_dict(),
    }


def rank_of_entry(entry: Mapping[str, Any]) -> RankSpec:
    """Parse what :func:`rank_entry` wrote."""
    return RankSpec(
        rank=int(entry["rank"]),
        local_rank=int(entry["local_rank"]),
        local_world_size=int(entry["local_world_size"]),
        node_rank=int(entry["node_rank"]),
        host_rank=int(entry["host_rank"]),
        host_local_rank=int(entry["host_local_rank"]),
        host_local_size=int(entry["host_local_size"]),
        task=TaskInfo.from_json(entry["task"]),
        cross_rank=int(entry.get("cross_rank", 0)),
        cross_size=int(entry.get("cross_size", 1)),
    )


def _target(task: TaskInfo) -> dict[str, Any]:
    return {
        "index": task.first_index,
        "host": task.host,
        "port": 0,
        "probe_port": task.probe_port,
        "interfaces": [[name, list(addrs)] for name, addrs in task.interfaces],
    }


def go_messages(layout: Layout, slots: Sequence[int]) -> list[dict[str, Any]]:
    """What the driver sends the connection that speaks for tasks ``slots``: ``layout``
    messages where its ranks do not fit one frame, then its ``go`` (see the module docstring).

    O(ranks on the hosts of ``slots``), plus O(hosts) for rank 0's task.
    """
    spec = layout.spec
    mine = [spec.ranks[layout.rank_of(i)] for i in slots]
    holds_rank0 = any(r.rank == 0 for r in mine)
    if holds_rank0 and layout.whole_for_rank0:
        ranks: Sequence[RankSpec] = spec.ranks
    else:
        firsts = sorted({r.rank - r.host_local_rank for r in mine})
        ranks = [r for first in firsts for r in _host_ranks(spec, spec.ranks[first])]
    targets: list[dict[str, Any]] = []
    if layout.probing:
        probing_for = {r.host_rank for r in mine if layout.probers[r.host_rank] in slots}
        wanted = sorted({t for host in probing_for for t in probe_targets(spec.num_hosts, host)})
        for host in wanted:
            target = spec.ranks[layout.rank_of(layout.probers[host])].task
            targets.append(_target(target))
    messages: list[dict[str, Any]] = []
    chunk: list[dict[str, Any]] = []
    size = 0
    for rank in ranks:
        entry, cost = layout.entry(rank)
        if chunk and size + cost > FRAME_BUDGET:
            messages.append(protocol.LAYOUT(ranks=chunk))
            chunk, size = [], 0
        chunk.append(entry)
        size += cost
    host_nodes = [[host, list(sizes)] for host, sizes in spec.host_nodes] if holds_rank0 else []
    messages.append(
        protocol.GO(
            world_size=spec.world_size,
            num_nodes=spec.num_nodes,
            num_hosts=spec.num_hosts,
            nodes=spec.nodes,
            master_addr=spec.master_addr,
            master_port=spec.master_port,
            first=layout.entry(spec.first)[0],
            ranks=chunk,
            host_nodes=host_nodes,
            probing=layout.probing,
            probe=targets,
        )
    )
    return messages


def whole_for_rank0(launcher: str | None) -> bool:
    """Whether rank 0's task needs every rank of the job: under ``launcher="mpi"`` it runs
    mpirun, which starts every host's ranks from there."""
    return launcher == "mpi"


def go_for(
    tasks: Sequence[TaskInfo],
    slots: Sequence[int],
    probing: bool,
    launcher: str | None,
    node: str = "auto",
    use_gpu: bool | None = None,
) -> dict[str, Any]:
    """The ``go`` of tasks ``slots``, computed where every task's info is at hand (a task
    that gathered them itself, without a driver), merged into one message."""
    layout = plan(tasks, whole_for_rank0(launcher), node, use_gpu)
    layout = dataclasses.replace(layout, probing=probing)
    assembler = GoAssembler()
    for message in go_messages(layout, slots):
        assembler.add(message)
    return assembler.go or {}


class GoAssembler:
    """Joins the ``layout`` messages that come before a ``go`` into it (task side)."""

    def __init__(self) -> None:
        self._ranks: list[dict[str, Any]] = []
        self.go: dict[str, Any] | None = None

    def add(self, message: Mapping[str, Any]) -> bool:
        """Take a ``layout`` or ``go`` message (any other kind is left alone); True once the
        ``go`` has come."""
        if message.get("type") == protocol.LAYOUT.name:
            self._ranks.extend(message["ranks"])
            return False
        if message.get("type") != protocol.GO.name:
            return False
        go = dict(message)
        go["ranks"] = self._ranks + list(go["ranks"])
        self._ranks = []
        self.go = go
        return True


@dataclasses.dataclass(frozen=True)
class TaskView:
    """What a task knows of the job once it has its ``go``.

    Attributes:
        spec: the ranks of its host(s) (every rank where it was sent the whole layout).
        probing: whether the interface is chosen by probes (wait for ``chosen``).
        probe: the tasks this task probes; empty when it is not its host's prober.
    """

    spec: ClusterSpec
    probing: bool
    probe: tuple[TaskInfo, ...]


def view_of(go: Mapping[str, Any]) -> TaskView:
    """A task's view of the job from its (whole) ``go`` message.

    Raises:
        SparkTrainError: a ``go`` whose ranks are not in order (a bug, not a user error).
    """
    ranks = tuple(rank_of_entry(e) for e in go["ranks"])
    if any(a.rank >= b.rank for a, b in zip(ranks, ranks[1:], strict=False)):
        raise SparkTrainError(f"a go with ranks out of order: {[r.rank for r in ranks]}")
    spec = ClusterSpec(
        ranks=ranks,
        master_addr=str(go["master_addr"]),
        master_port=int(go["master_port"]),
        world_size=int(go["world_size"]),
        num_nodes=int(go["num_nodes"]),
        first=rank_of_entry(go["first"]),
        host_nodes=tuple(
            (str(host), tuple(int(n) for n in sizes)) for host, sizes in go.get("host_nodes", ())
        ),
        num_hosts=int(go["num_hosts"]),
        nodes=str(go["nodes"]),
    )
    probe = tuple(TaskInfo.from_json(t) for t in go.get("probe", ()))
    return TaskView(spec=spec, probing=bool(go.get("probing")), probe=probe)
