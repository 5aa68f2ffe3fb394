"""Who is where: what each task reports at rendezvous, and the pure mapping to ranks."""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sparktrain.errors import SparkTrainError


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """What one task (or one local slot) knows about itself at rendezvous.

    Attributes:
        index: the slot's index (0 .. np-1): the task's partition index when each task runs
            one rank; the local supervisor numbers its slots; a task that runs k ranks (k GPUs
            per task) holds slots ``partition * k`` .. ``partition * k + k - 1``.
        host: the address other ranks reach this task's host on.
        port: a free TCP port on that host, offered for the master.
        gpus: GPU addresses Spark assigned to the task (or the local devices), as strings.
        cpus: CPU cores the task may use.
        pid: process id of the task, for diagnostics.
        ifname: the network interface that carries ``host``, when it could be found.
        gpu_uuids: the physical identity (UUID) of each of ``gpus``, in the same order, when
            the task could read it; tells GPUs numbered alike in separate containers apart
            from one GPU given to two tasks.
        interfaces: this task's network interfaces with their IPv4 addresses (loopback left
            out), as ``(name, (address, ...))`` sorted by name; what the interface probe tests.
        probe_port: the port of this task's interface probe listener (0: none).
        name_address: where this host's own name resolves to here (``gethostname()``, first
            address that binds), which is where Horovod's Gloo binds some of its sockets
            whatever interface it is told; ``""`` when it resolves to nothing that binds,
            None when not asked (only Horovod's Gloo needs it).
        slot: the position of this slot among the slots of its Spark task (0 .. k-1); 0
            when each task runs one rank.
    """

    index: int
    host: str
    port: int
    gpus: tuple[str, ...] = ()
    cpus: int = 1
    pid: int = 0
    ifname: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    interfaces: tuple[tuple[str, tuple[str, ...]], ...] = ()
    probe_port: int = 0
    name_address: str | None = None

    def addresses_of(self, ifname: str) -> tuple[str, ...]:
        """The IPv4 addresses of interface ``ifname`` on this task's host (none if absent)."""
        return dict(self.interfaces).get(ifname, ())

    slot: int = 0

    @property
    def first_index(self) -> int:
        """The index of the first slot of the same Spark task (which speaks for the task)."""
        return self.index - self.slot

    def as_dict(self) -> dict[str, Any]:
        """This info as a JSON object (what :meth:`to_json` writes)."""
        data = dataclasses.asdict(self)
        data["gpus"] = list(self.gpus)
        data["gpu_uuids"] = list(self.gpu_uuids)
        data["interfaces"] = [[name, list(addrs)] for name, addrs in self.interfaces]
        return data

    def to_json(self) -> str:
        """Serialize for the hello a task sends the driver (and the driver's "go")."""
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> TaskInfo:
        """Parse what :meth:`to_json` produced."""
        data = json.loads(text) if isinstance(text, str) else dict(text)
        return cls(
            index=int(data["index"]),
            host=str(data["host"]),
            port=int(data["port"]),
            gpus=tuple(str(g) for g in data.get("gpus", ())),
            cpus=int(data.get("cpus", 1)),
            pid=int(data.get("pid", 0)),
            ifname=data.get("ifname"),
            gpu_uuids=tuple(str(u) for u in data.get("gpu_uuids", ())),
            interfaces=tuple(
                (str(name), tuple(str(a) for a in addrs))
                for name, addrs in data.get("interfaces", ())
            ),
            probe_port=int(data.get("probe_port", 0)),
            name_address=data.get("name_address"),
            slot=int(data.get("slot", 0)),
        )


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """Where one rank sits in the job.

    A *node* is what ``LOCAL_RANK``, ``NODE_RANK`` and Horovod's local and cross ranks count
    in: a host, or a Spark task (see :func:`node_rule`). The host fields say where the rank
    runs whatever the rule (the rendezvous, probes and mpirun work per host).

    Attributes:
        rank: global rank.
        local_rank: index among the ranks of the same node.
        local_world_size: number of ranks of that node.
        node_rank: index of the node, in order of its lowest rank.
        host_rank: index of the host, in order of first appearance.
        host_local_rank: index among the ranks on the same host.
        host_local_size: number of ranks on that host.
        task: the task that runs this rank.
        cross_rank: the position of its node among the nodes that have a rank with the same
            local rank (in node order): Horovod's cross rank.
        cross_size: the number of those nodes: Horovod's cross size.
    """

    rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host_rank: int
    host_local_rank: int
    host_local_size: int
    task: TaskInfo
    cross_rank: int = 0
    cross_size: int = 1


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The job's layout: the whole of it on the driver, a task's view of it on a task.

    A task is told the ranks of its own host (and of every host it speaks for), never every
    rank of the job (see :mod:`sparktrain.layout.rendezvous`): what a rank needs of the others is
    counted here (``world_size``, ``num_nodes``, ``num_hosts``) or is rank 0's (``first``).

    Attributes:
        ranks: the ranks known here, ordered by global rank: every rank (see
            :attr:`complete`), or those on the hosts of a task's view.
        master_addr: address of rank 0's host.
        master_port: the port rank 0 offered.
        world_size: number of ranks in the job.
        num_nodes: number of nodes in the job (``GROUP_WORLD_SIZE``).
        first: rank 0, wherever it runs.
        host_nodes: every host of the job with the number of ranks of each of its nodes,
            in node order, where it is known (the whole layout, and rank 0's task's view:
            Horovod's rendezvous server is sized by it); empty in other views.
        num_hosts: number of distinct hosts in the job.
        nodes: what a node is in this job: ``"host"`` or ``"task"`` (see :func:`node_rule`).
    """

    ranks: tuple[RankSpec, ...]
    master_addr: str
    master_port: int
    world_size: int
    num_nodes: int
    first: RankSpec
    host_nodes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    num_hosts: int = 1
    nodes: str = "host"

    @property
    def node_sizes(self) -> tuple[tuple[str, int], ...]:
        """Every node of the job (its :meth:`node_name`) with its number of ranks, in node
        order, where :attr:`host_nodes` is known."""
        return tuple(
            (node_name(host, self.nodes, position), size)
            for host, sizes in self.host_nodes
            for position, size in enumerate(sizes)
        )

    @property
    def complete(self) -> bool:
        """Whether :attr:`ranks` holds every rank of the job."""
        return len(self.ranks) == self.world_size

    def for_task(self, index: int) -> RankSpec:
        """The rank run by the task with this partition index."""
        for rank in self.ranks:
            if rank.task.index == index:
                return rank
        raise KeyError(f"no rank for task {index}")

    def on_host(self, host: str) -> list[RankSpec]:
        """The ranks on ``host``, by their index on it."""
        return sorted(
            (r for r in self.ranks if r.task.host == host), key=lambda r: r.host_local_rank
        )

    def on_node(self, rank: RankSpec) -> list[RankSpec]:
        """The ranks of ``rank``'s node (``rank`` too), by local rank."""
        return [r for r in self.on_host(rank.task.host) if r.node_rank == rank.node_rank]

    def hosts(self) -> list[tuple[str, int]]:
        """Each host of :attr:`ranks` with its number of ranks, in host order."""
        seen: dict[str, int] = {}
        for r in self.ranks:
            seen[r.task.host] = seen.get(r.task.host, 0) + 1
        return list(seen.items())

    def node_name(self, rank: RankSpec) -> str:
        """The name of ``rank``'s node (Horovod's ``HOROVOD_HOSTNAME``): its host, or where
        nodes are tasks, its host and the node's place among the host's nodes (see
        :func:`node_name`)."""
        if self.nodes == "host":
            return rank.task.host
        # A host's nodes are contiguous in node order: its first rank is on its first node.
        first = self.on_host(rank.task.host)[0].node_rank
        return node_name(rank.task.host, self.nodes, rank.node_rank - first)


def node_name(host: str, nodes: str, position: int) -> str:
    """The name of the node at ``position`` among ``host``'s nodes under the rule ``nodes``
    (``"host"`` or ``"task"``): the host, or ``host-<position>``. It names Horovod's
    rendezvous scopes, so no ``/``; and rank 0's task rebuilds every name from each host's
    node sizes (see :mod:`sparktrain.layout.rendezvous`)."""
    return host if nodes == "host" else f"{host}-{position}"


def node_rule(infos: Sequence[TaskInfo], node: str = "auto", use_gpu: bool | None = None) -> str:
    """What a node is for these tasks: ``"host"`` or ``"task"``.

    The rule, for the whole job: with ``node="auto"`` every host is a node (its ranks count
    ``LOCAL_RANK`` 0, 1, ... and see the host's GPUs in that order), except where two tasks
    on one host report the same GPU id (:func:`shared_gpu_ids`: each task numbers its own
    GPUs from 0, as containers do), which cannot make one device numbering: then every Spark
    task is a node, as under TorchDistributor (torchrun per task). ``"host"`` and ``"task"``
    choose; with ``use_gpu=False`` nothing is numbered, so ``"auto"`` is ``"host"``.

    Args:
        infos: every task's hello.
        node: the ``node`` setting: auto, host or task.
        use_gpu: the ``use_gpu`` setting.
    """
    if node in ("host", "task"):
        return node
    if use_gpu is False:
        return "host"
    by_host: dict[str, list[TaskInfo]] = {}
    for info in infos:
        by_host.setdefault(info.host, []).append(info)
    return "task" if any(shared_gpu_ids(tasks) for tasks in by_host.values()) else "host"


def build_cluster_spec(
    infos: Sequence[TaskInfo], node: str = "auto", use_gpu: bool | None = None
) -> ClusterSpec:
    """Map what the tasks said of themselves at rendezvous to ranks.

    Hosts are numbered in order of their lowest task index; ranks are contiguous per host and,
    inside a host, follow task index. Task 0 is therefore always rank 0, and its host and port
    are the master's. Nodes (hosts, or tasks: :func:`node_rule`) are numbered in rank order,
    so ``RANK`` is the ranks of the nodes before plus ``LOCAL_RANK``, as under torchrun.

    Args:
        infos: one entry per task, in any order; indices must be 0 .. n-1 exactly once.
        node: the ``node`` setting (see :func:`node_rule`).
        use_gpu: the ``use_gpu`` setting.

    Returns:
        The ClusterSpec every task derives identically.

    Raises:
        SparkTrainError: when the indices are not 0 .. n-1 (a bug, not a user error).
    """
    ordered = sorted(infos, key=lambda i: i.index)
    if [i.index for i in ordered] != list(range(len(ordered))) or not ordered:
        raise SparkTrainError(f"rendezvous got task indices {[i.index for i in ordered]}")
    nodes = node_rule(ordered, node, use_gpu)
    by_host: dict[str, list[TaskInfo]] = {}
    for info in ordered:
        by_host.setdefault(info.host, []).append(info)
    # Nodes in rank order: a host's tasks follow task index, and a task's slots are in order.
    by_node: list[list[TaskInfo]] = []
    host_nodes: list[tuple[str, tuple[int, ...]]] = []
    for host, tasks in by_host.items():
        on_host: dict[int, list[TaskInfo]] = {}
        for info in tasks:
            on_host.setdefault(info.first_index if nodes == "task" else 0, []).append(info)
        by_node.extend(on_host.values())
        host_nodes.append((host, tuple(len(members) for members in on_host.values())))
    sizes = [len(tasks) for tasks in by_node]
    # Horovod's cross ranks: for each local rank, the nodes that have one, in node order.
    with_local: dict[int, list[int]] = {}
    for node_rank, size in enumerate(sizes):
        for local_rank in range(size):
            with_local.setdefault(local_rank, []).append(node_rank)
    # task index -> (node rank, local rank)
    place = {
        info.index: (node_rank, local_rank)
        for node_rank, tasks in enumerate(by_node)
        for local_rank, info in enumerate(tasks)
    }
    ranks: list[RankSpec] = []
    for host_rank, tasks in enumerate(by_host.values()):
        for host_local_rank, info in enumerate(tasks):
            node_rank, local_rank = place[info.index]
            holders = with_local[local_rank]
            ranks.append(
                RankSpec(
                    rank=len(ranks),
                    local_rank=local_rank,
                    local_world_size=sizes[node_rank],
                    node_rank=node_rank,
                    host_rank=host_rank,
                    host_local_rank=host_local_rank,
                    host_local_size=len(tasks),
                    task=info,
                    # Nodes come in order, so a node's position is found by bisection.
                    cross_rank=bisect.bisect_left(holders, node_rank),
                    cross_size=len(holders),
                )
            )
    master = ranks[0].task
    return ClusterSpec(
        ranks=tuple(ranks),
        master_addr=master.host,
        master_port=master.port,
        world_size=len(ranks),
        num_nodes=len(sizes),
        first=ranks[0],
        host_nodes=tuple(host_nodes),
        num_hosts=len(by_host),
        nodes=nodes,
    )


def shared_gpu_ids(tasks: Sequence[TaskInfo]) -> bool:
    """Whether two of ``tasks`` (on one host) report the same GPU id: then the ids are not one
    numbering of the host's GPUs (containers each number their own from 0, or a discovery
    script numbers per executor), and each rank may see its own task's GPUs only."""
    seen: set[str] = set()
    for task in tasks:
        if seen & set(task.gpus):
            return True
        seen |= set(task.gpus)
    return False


def gpu_numbering_clash(tasks: Sequence[TaskInfo]) -> tuple[TaskInfo, TaskInfo, str] | None:
    """Two tasks on one host that report the same GPU id, with the id; or None.

    Such tasks number their GPUs each on their own (see :func:`shared_gpu_ids`), so the ranks
    of their host cannot be one node with one device numbering.
    """
    seen: dict[tuple[str, str], TaskInfo] = {}
    for task in sorted(tasks, key=lambda t: t.index):
        for gpu in task.gpus:
            other = seen.setdefault((task.host, gpu), task)
            if other.first_index != task.first_index:
                return other, task, gpu
    return None


def gpu_double_booking(tasks: Sequence[TaskInfo]) -> str | None:
    """Why the layout gives one physical GPU to two tasks, or None.

    A GPU counts as one when two tasks on a host report the same UUID for it; where the
    UUIDs could not be read, GPU ids alike on one host are taken as separate GPUs (see
    :func:`shared_gpu_ids`).
    """
    owners: dict[tuple[str, str], tuple[int, str]] = {}
    for task in tasks:
        for gpu, uuid in zip(task.gpus, task.gpu_uuids, strict=False):
            key = (task.host, uuid)
            if key in owners and owners[key][0] != task.index:
                first, first_gpu = owners[key]
                return (
                    f"tasks {first} and {task.index} on {task.host} were both given the GPU "
                    f"{uuid} (as GPU {first_gpu} and GPU {gpu}): two ranks cannot share one GPU. "
                    "Check the executors' GPU discovery script and resources "
                    "(spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount, "
                    "spark.worker.resource.gpu.discoveryScript)"
                )
            owners.setdefault(key, (task.index, gpu))
    return None
