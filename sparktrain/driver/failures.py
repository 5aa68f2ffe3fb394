"""How a launch that went wrong reads to the user: ranks that never arrived, and a Spark job
that failed by itself (an executor lost, a JVM out of memory)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from sparktrain.config import RunConfig, conf_key
from sparktrain.errors import RendezvousTimeoutError, WorkerFailure


def rendezvous_timeout(config: RunConfig, arrived: Collection[int]) -> RendezvousTimeoutError:
    """The error for tasks that did not all say hello within ``start_timeout``."""
    n = config.world_size
    missing = sorted(set(range(n)) - set(arrived))
    return RendezvousTimeoutError(
        f"ranks {missing} never reached the rendezvous within start_timeout="
        f"{config.start_timeout:g}s ({conf_key('start_timeout')}); ranks "
        f"{sorted(arrived)} arrived. Check that the cluster can run {n} tasks at "
        "once and that executors can reach the driver, or raise start_timeout.",
        missing=missing,
    )


def job_failure(
    text: str,
    task: Any,
    started: Mapping[int, Mapping[str, Any]],
    infos: Mapping[int, Mapping[str, Any]],
) -> WorkerFailure:
    """The failure of a launch that ended in an error of its own, on the rank of the task it
    names (``task``: its ``index``, ``host``, ``executor`` and ``reason``, or None).

    Args:
        text: the launch's one-line description of the error.
        task: the Spark task the error names, if it names one.
        started: the ranks' "started" messages, by rank.
        infos: what each task said of itself at rendezvous, by index.
    """
    if task is None:
        return WorkerFailure(rank=-1, phase="lost", time=time.time(), message=text)
    ranks = [r for r, m in started.items() if m.get("index") == task.index]
    host = str(infos.get(task.index, {}).get("host") or task.host)
    return WorkerFailure(
        rank=ranks[0] if ranks else task.index,
        host=host,
        phase="lost",
        time=time.time(),
        message=f"its Spark task {task.index} on executor {task.executor} failed: "
        + (task.reason or text),
    )
