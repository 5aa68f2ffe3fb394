"""What the driver refuses once every task has said where it is, before any rank starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparktrain.backends import get_backend
from sparktrain.cluster import TaskInfo, build_cluster_spec, gpu_double_booking
from sparktrain.config import RunConfig
from sparktrain.interfaces import Reached, choose_interface, missing_nics


def layout_problem(infos: Sequence[Mapping[str, Any]], config: RunConfig) -> str | None:
    """Why the tasks' layout cannot run, or None.

    Args:
        infos: every task's hello (a TaskInfo as JSON).
        config: the run's settings.

    Returns:
        The message of the ConfigurationError to raise: one GPU given to two tasks, a ``nics``
        interface missing on a host, or what the backend cannot do on these hosts.
    """
    tasks = [TaskInfo.from_json(dict(info)) for info in infos]
    problem = gpu_double_booking(tasks)
    if problem is None and config.nics:
        problem = missing_nics(tasks, config.nics)
    if problem is None:
        problem = get_backend(config.backend).layout_problem(build_cluster_spec(tasks), config)
    return problem


class InterfaceVote:
    """What every task's interface probes reached, until all have said (see
    :mod:`sparktrain.task.probe`).

    Args:
        n: number of tasks.
        nics: the run's ``nics`` setting.
    """

    def __init__(self, n: int, nics: Sequence[str] | None) -> None:
        self.n = n
        self.nics = nics
        self.reached: dict[int, Reached] = {}

    def add(
        self, index: int, reached: Reached, infos: Mapping[int, Mapping[str, Any]]
    ) -> tuple[str | None, str | None] | None:
        """Count task ``index``'s probes.

        Returns:
            None until every task has probed; then :func:`choose_interface`'s answer.
        """
        self.reached[index] = reached
        if len(self.reached) < self.n:
            return None
        tasks = [TaskInfo.from_json(dict(infos[i])) for i in range(self.n)]
        return choose_interface(tasks, self.reached, self.nics)
