"""What the driver refuses once every task has said where it is, before any rank starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparktrain.backends import get_backend
from sparktrain.config import RunConfig, conf_key
from sparktrain.layout.cluster import (
    ClusterSpec,
    TaskInfo,
    build_cluster_spec,
    gpu_double_booking,
    gpu_numbering_clash,
)
from sparktrain.layout.interfaces import Reached, choose_interface, missing_nics
from sparktrain.layout.rendezvous import Layout, plan, probe_plan, whole_for_rank0


def layout_problem(
    infos: Sequence[Mapping[str, Any] | TaskInfo],
    config: RunConfig,
    spec: ClusterSpec | None = None,
) -> str | None:
    """Why the tasks' layout cannot run, or None.

    Args:
        infos: every task's hello (a TaskInfo as JSON), or the TaskInfos.
        config: the run's settings.
        spec: their layout, when it was computed already.

    Returns:
        The message of the ConfigurationError to raise: one GPU given to two tasks, a ``nics``
        interface missing on a host, or what the backend cannot do on these hosts.
    """
    tasks = [i if isinstance(i, TaskInfo) else TaskInfo.from_json(dict(i)) for i in infos]
    problem = gpu_double_booking(tasks) or host_nodes_problem(tasks, config)
    if problem is None and config.nics:
        problem = missing_nics(tasks, config.nics)
    if problem is None:
        spec = spec or build_cluster_spec(tasks, config.node, config.use_gpu)
        problem = get_backend(config.backend).layout_problem(spec, config)
    return problem


def host_nodes_problem(tasks: Sequence[TaskInfo], config: RunConfig) -> str | None:
    """Why ``node="host"`` cannot hold on these tasks, or None: two tasks of a host number
    their GPUs each from 0, so no one numbering of the host's GPUs puts each rank's own GPU
    at ``cuda:{LOCAL_RANK}``."""
    if config.node != "host" or config.use_gpu is False:
        return None
    clash = gpu_numbering_clash(tasks)
    if clash is None:
        return None
    first, second, gpu = clash
    return (
        f"node='host' makes the ranks of a host one node, numbered LOCAL_RANK 0, 1, ... with "
        f"device cuda:{{LOCAL_RANK}} their own GPU; but tasks {first.first_index} and "
        f"{second.first_index} on {first.host} both call their GPU {gpu!r} (each executor "
        "numbers its own GPUs from 0, as containers do), so the host's GPUs have no one "
        "numbering. Use node='task' (every Spark task a node of its own, as under "
        f"TorchDistributor) or node='auto' (argument node=, or {conf_key('node')}), or "
        "use_gpu=False"
    )


def plan_for(tasks: Sequence[TaskInfo], config: RunConfig) -> Layout:
    """The run's layout: rank 0's task gets every rank when it launches every host's ranks
    (``launcher="mpi"``: mpirun starts them all from there)."""
    return plan(tasks, whole_for_rank0(config.launcher), config.node, config.use_gpu)


class InterfaceVote:
    """What each host's prober reached, until all have said (see :mod:`sparktrain.task.interface_probe`).

    Args:
        layout: the job's layout (its probers and what each probes).
        nics: the run's ``nics`` setting.
    """

    def __init__(self, layout: Layout, nics: Sequence[str] | None) -> None:
        self.layout = layout
        self.nics = nics
        self.reached: dict[int, Reached] = {}
        self._waiting = set(layout.probers) if layout.probing else set()

    def add(self, index: int, reached: Reached) -> tuple[str | None, str | None] | None:
        """Count prober ``index``'s probes (another task's word is not asked for: ignored).

        Returns:
            None until every host's prober has said; then :func:`choose_interface`'s answer.
        """
        if index not in self._waiting:
            return None
        self._waiting.discard(index)
        self.reached[index] = reached
        if self._waiting:
            return None
        hosts = self.layout.prober_tasks()
        targets = probe_plan(len(hosts))
        return choose_interface(hosts, self.reached, self.nics, targets)
