"""Elastic runs (``np=(min, max)``): the size of each attempt, and when to grow back.

An elastic run starts with the largest size in ``[min, max]`` the cluster's free task slots
allow, restarts after a lost rank at the largest size that fits then (never below min, never
waiting for the lost executors), and, while it runs below max, looks for free slots at most
every ``resize_interval`` seconds, when rank 0 has just saved a checkpoint: if there are more,
its ranks are stopped and launched again larger, from that checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from sparktrain.config import RunConfig, conf_key
from sparktrain.driver import capacity
from sparktrain.errors import ConfigurationError, SparkTrainError
from sparktrain.log import get_logger

_log = get_logger(__name__)


class ResizeStop(SparkTrainError):
    """The ranks of an elastic run were stopped after a checkpoint, to launch it larger.

    Never reaches the user: the run goes on at ``size`` ranks.
    """

    def __init__(self, size: int, reason: str) -> None:
        super().__init__(reason)
        self.size = size
        self.reason = reason


def smallest(config: RunConfig, ranks_per_task: int) -> int:
    """The smallest size the run may take: min, rounded up to whole tasks of k ranks.

    Raises:
        ConfigurationError: no size in ``[min, max]`` is a multiple of k.
    """
    low, high = config.elastic or (config.world_size, config.world_size)
    k = ranks_per_task
    size = -(-low // k) * k
    if size > high:
        raise ConfigurationError(
            f"np={(low, high)!r} holds no multiple of spark.task.resource.gpu.amount={k}: "
            f"each task runs {k} ranks, one per GPU, so every size is a multiple of {k}. "
            f"Widen the range to include {size} (np=({low}, {size})), or set "
            "spark.task.resource.gpu.amount=1 for one rank per task"
        )
    return size


def fitting_size(free_tasks: int, low: int, high: int, ranks_per_task: int = 1) -> int | None:
    """The largest size in ``[low, high]`` of whole tasks that ``free_tasks`` slots run.

    Args:
        free_tasks: task slots free now.
        low: the run's min (ranks).
        high: the run's max (ranks).
        ranks_per_task: k ranks per task (sizes are multiples of k).

    Returns:
        The size in ranks, or None when even ``low`` does not fit.
    """
    k = ranks_per_task
    size = min(max(0, free_tasks), high // k) * k
    return size if size >= max(low, 1) else None


def free_tasks(sc: Any, held: int, own: int = 0) -> int:
    """Task slots free now: the cluster's, less those busy or held by other runs of this
    process, and less ``own`` (the run's own tasks, when they are running)."""
    total = capacity.total_slots(sc)
    busy = capacity.busy_slots(sc)
    return total - max(busy, held + own)


def choose_size(
    sc: Any,
    config: RunConfig,
    ranks_per_task: int,
    held: int,
    since: float | None,
) -> int:
    """The size of an elastic run's next attempt: the largest that fits now.

    Below min, it waits for min as a fixed-size run waits for its np (``capacity_wait``,
    from ``since``), and fails as it does. After a failed attempt (``since`` given), the
    tasks of the cancelled job may still be ending: they get a moment (as in
    :func:`~sparktrain.driver.capacity.check_capacity`) before the free slots are counted,
    so the run does not shrink for its own tasks.

    Raises:
        CapacityError: not even min fits within ``capacity_wait``, with the capacity message.
    """
    low, high = config.elastic or (config.world_size, config.world_size)
    k = ranks_per_task
    least = smallest(config, k)
    if since is not None:
        _settle(sc, held)
    size = fitting_size(free_tasks(sc, held), least, high, k)
    if size is not None:
        return size
    capacity.check_capacity(
        sc, least // k, config.capacity_wait, since=since, ranks_per_task=k, held=held
    )
    return fitting_size(free_tasks(sc, held), least, high, k) or least


def _settle(sc: Any, held: int, clock: Callable[[], float] = time.monotonic) -> None:
    """Wait (up to capacity's BUSY_WAIT) while tasks beyond other runs' are busy."""
    deadline = clock() + capacity.BUSY_WAIT
    while capacity.busy_slots(sc) > held and clock() < deadline:
        time.sleep(capacity.POLL_INTERVAL)  # tasks end with no event Python can wait on


@dataclasses.dataclass
class GrowWatch:
    """When an elastic attempt below max should stop at a checkpoint to grow.

    Attributes:
        size: the attempt's size (ranks).
        high: the run's max.
        ranks_per_task: k ranks per task.
        interval: ``resize_interval``: least seconds between two looks at the cluster.
        free: task slots free beside the run's own tasks, now.
        clock: monotonic seconds (a test's fake clock).
        last: when the cluster was last looked at (the attempt's start, at first).
    """

    size: int
    high: int
    ranks_per_task: int
    interval: float
    free: Callable[[], int]
    clock: Callable[[], float] = time.monotonic
    last: float = dataclasses.field(default=-1.0)

    def __post_init__(self) -> None:
        if self.last < 0:
            self.last = self.clock()

    def on_saved(self, step: int) -> ResizeStop | None:
        """Rank 0 saved checkpoint ``step``: the stop to grow at, when more slots are free
        and ``interval`` has passed since the last look; else None."""
        k = self.ranks_per_task
        if self.size >= self.high:
            return None
        now = self.clock()
        if now - self.last < self.interval:
            return None
        self.last = now
        target = min(self.high // k, self.size // k + max(0, self.free())) * k
        if target <= self.size:
            return None
        reason = (
            f"grow from {self.size} to {target} ranks: task slots became free "
            f"(stopped after checkpoint step {step})"
        )
        _log.info("elastic run: %s", reason)
        return ResizeStop(target, reason)


def grow_watch(
    sc: Any, config: RunConfig, size: int, ranks_per_task: int, held: Callable[[], int]
) -> GrowWatch | None:
    """The grow watch of an attempt of ``size`` ranks, or None where it never grows (not
    elastic, at max already, or ``elastic_grow=False``)."""
    if config.elastic is None or not config.elastic_grow or size >= config.elastic[1]:
        return None
    own = size // ranks_per_task
    return GrowWatch(
        size=size,
        high=config.elastic[1],
        ranks_per_task=ranks_per_task,
        interval=config.resize_interval,
        free=lambda: free_tasks(sc, held(), own),
    )


def size_note(config: RunConfig, size: int, previous: int | None, why: str) -> str:
    """The log line of an elastic attempt's size."""
    low, high = config.elastic or (size, size)
    was = f" (was {previous})" if previous is not None and previous != size else ""
    grow = "" if config.elastic_grow else f", {conf_key('elastic_grow')}=false"
    ranks = "rank" if size == 1 else "ranks"
    return f"elastic run np=({low}, {high}): {size} {ranks}{was}: {why}{grow}"
