"""Before submitting: can the cluster run np barrier tasks at once? Say so now, not later.

Spark's own check retries a barrier stage that lacks slots 40 times, 15 s apart, with only a
log line to show for it; we refuse up front with what was found and what to change.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

from sparktrain.config import conf_key
from sparktrain.errors import CapacityError
from sparktrain.log import get_logger

_log = get_logger(__name__)

POLL_INTERVAL = 0.25
# How long slots held by other jobs may take to free up before the run is refused.
BUSY_WAIT = 15.0


def total_slots(sc: Any) -> int:
    """Tasks the cluster can run at once with the default resource profile."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - internal API; fall back to what the conf says
        pass
    match = re.match(r"local(\[(\d+|\*)|$)", sc.master)
    conf = sc.getConf()
    task_cpus = int(conf.get("spark.task.cpus", "1"))
    if match:
        return int(sc.defaultParallelism) // task_cpus
    executors = max(0, jsc.getExecutorMemoryStatus().size() - 1)
    return executors * int(conf.get("spark.executor.cores", "1")) // task_cpus


_LOCAL = re.compile(r"^local(?:\[\s*(\d+|\*)\s*(?:,\s*\d+\s*)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def _number(conf: Any, key: str) -> float | None:
    value = conf.get(key, None)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def most_slots(master: str, conf: Any) -> tuple[int, str] | None:
    """The most tasks the application could ever run at once, where its settings bound it.

    A local or local-cluster master names its threads or its executors and their cores;
    elsewhere
    ``spark.executor.instances`` (with ``spark.executor.cores``) or ``spark.cores.max``
    bound the cores. Each executor's GPUs bound its tasks too, when tasks take GPUs.

    Returns:
        ``(slots, how that was found)``, or None where nothing bounds it (executors may
        still be registering and their number is not known in advance).
    """
    task_cpus = int(_number(conf, "spark.task.cpus") or 1)
    task_gpus = _number(conf, "spark.task.resource.gpu.amount") or 0.0
    executor_gpus = _number(conf, "spark.executor.resource.gpu.amount")
    cores_max = _number(conf, "spark.cores.max")
    local = _LOCAL.match(master.strip())
    if local:
        spec = local.group(1)
        threads = 1 if spec is None else (os.cpu_count() or 1) if spec == "*" else int(spec)
        return threads // task_cpus, f"master {master}, spark.task.cpus={task_cpus}"
    match = _LOCAL_CLUSTER.match(master.strip())
    if match:
        executors, cores = int(match.group(1)), int(match.group(2))
        how = f"{master}: {executors} executor(s) x {cores} core(s)"
    else:
        instances = _number(conf, "spark.executor.instances")
        executor_cores = _number(conf, "spark.executor.cores")
        if instances is not None and executor_cores is not None:
            executors, cores = int(instances), int(executor_cores)
            how = f"spark.executor.instances={executors} x spark.executor.cores={cores}"
        elif cores_max is not None:
            slots = int(cores_max) // task_cpus
            return slots, f"spark.cores.max={int(cores_max)}, spark.task.cpus={task_cpus}"
        else:
            return None
    per_executor = cores // task_cpus
    how += f", spark.task.cpus={task_cpus}"
    if task_gpus > 0 and executor_gpus is not None:
        per_executor = min(per_executor, int(executor_gpus / task_gpus + 1e-9))
        how += (
            f", spark.executor.resource.gpu.amount={executor_gpus:g}, "
            f"spark.task.resource.gpu.amount={task_gpus:g}"
        )
    slots = executors * per_executor
    if cores_max is not None:
        slots = min(slots, int(cores_max) // task_cpus)
        how += f", spark.cores.max={int(cores_max)}"
    return slots, how


def busy_slots(sc: Any) -> int:
    """Tasks currently running for other jobs, or still ending after their job was cancelled.

    A cancelled job's stage leaves the active stages at once, while its tasks may take
    seconds more to be killed on the executors (a Python worker is killed after
    ``spark.python.task.killTimeout``), holding their slots: the executors' own count of
    running tasks sees those too.
    """
    tracker = sc.statusTracker()
    in_stages = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            in_stages += int(info.numActiveTasks)
    try:
        executors = sc._jsc.sc().statusTracker().getExecutorInfos()
        on_executors = sum(int(e.numRunningTasks()) for e in executors)
    except Exception:  # noqa: BLE001 - internal API; the stages' count has to do
        on_executors = 0
    return max(in_stages, on_executors)


def check_capacity(
    sc: Any,
    n: int,
    wait: float,
    since: float | None = None,
    ranks_per_task: int = 1,
    held: int = 0,
) -> None:
    """Raise CapacityError unless ``n`` task slots are free.

    Slots count tasks, not ranks: with k GPUs per task (``ranks_per_task``), np ranks need
    ``n = np / k`` slots.

    A session that started less than ``wait`` seconds ago may still be registering executors,
    so it gets until then; an older one is judged at once, unless the application's settings
    give it the slots (then those missing are still starting: a busy host can take longer than
    ``wait`` to hand over a new session, so the run waits up to ``wait`` from its own start).
    Each executor that registers meanwhile starts that wait again. ``since`` (epoch seconds)
    moves the start, e.g. to when a restart found executors lost.

    Where the application's settings bound how many tasks it can ever run at once (see
    :func:`most_slots`) and np is over that, it is refused at once, however young the session.

    ``held`` slots belong to other runs of this process still going (see
    :mod:`sparktrain.driver.inflight`), whether or not Spark runs their tasks yet: when the
    cluster has slots enough but not beside theirs, the run is refused at once, saying so
    (they free their slots only when they end, which may be hours).

    Raises:
        CapacityError: dynamic allocation is on, or too few slots, naming the settings.
    """
    conf = sc.getConf()
    _refuse_dynamic_allocation(conf)
    check = _Check(sc, n, ranks_per_task, wait, since, held, most_slots(sc.master, conf))
    began = time.time()
    deadline = (since if since is not None else sc.startTime / 1000.0) + wait
    if check.promised_from_now:
        # A busy host can take longer than capacity_wait to bring a new session up (its start
        # time is set when the context begins, not when the caller gets it), so a run that
        # finds promised executors missing gets the whole wait from now.
        deadline = max(deadline, began + wait)
    total = _wait_for_slots(check, deadline)
    if total is not None:
        raise _too_few(check, conf, total, began)


@dataclasses.dataclass(frozen=True)
class _Check:
    """One capacity check: what the run needs, and what the application's settings give it.

    Attributes:
        sc: the SparkContext.
        n: the task slots the run needs.
        k: ranks per task.
        wait: ``capacity_wait``, in seconds.
        since: when the wait started (epoch seconds), where the caller moved it.
        held: slots the other runs of this process hold.
        ceiling: the most slots the application's settings ever give it, and how that was
            found (see :func:`most_slots`); None where they do not bound it.
    """

    sc: Any
    n: int
    k: int
    wait: float
    since: float | None
    held: int
    ceiling: tuple[int, str] | None

    @property
    def need(self) -> str:
        """How the run's size reads in messages: np, and the tasks it makes when they differ."""
        k = self.k
        return f"np={self.n * k}" + (
            f" ({self.n} tasks of {k} ranks, one per GPU)" if k > 1 else ""
        )

    @property
    def promised(self) -> bool:
        """The application's own settings give it slots enough: those missing are still coming."""
        return self.ceiling is not None and self.ceiling[0] >= self.n

    @property
    def promised_from_now(self) -> bool:
        """Promised, and the wait not moved by the caller: it counts from the run's start."""
        return self.promised and self.since is None


def _refuse_dynamic_allocation(conf: Any) -> None:
    """Barrier tasks need a fixed set of executors: refuse where dynamic allocation is on."""
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise CapacityError(
            "barrier tasks need a fixed set of executors, but dynamic allocation is on: set "
            "spark.dynamicAllocation.enabled=false (and spark.executor.instances) for this "
            "application"
        )


def _wait_for_slots(check: _Check, deadline: float) -> int | None:
    """Look at the cluster until ``check.n`` slots are free (None), or ``deadline`` passed
    with too few (the slots it has then).

    Raises:
        CapacityError: at once, where waiting longer cannot give the slots.
    """
    busy_deadline: float | None = None
    told_registering = False
    seen = -1
    while True:
        total = total_slots(check.sc)
        if check.promised and seen >= 0 and total > seen:
            # Another executor registered: they are still coming; the wait starts again.
            deadline = max(deadline, time.time() + check.wait)
        seen = total
        # The other runs' tasks are among the busy ones once Spark runs them.
        busy = max(busy_slots(check.sc), check.held)
        if total - busy >= check.n:
            return None
        now = time.time()
        _refuse_beside_held(check, total)
        if total >= check.n and busy:
            busy_deadline = _wait_for_busy(check, busy, total, now, busy_deadline)
        elif check.ceiling is not None and check.ceiling[0] < check.n:
            # More executors cannot come: waiting for them would only delay the refusal.
            raise _never_enough(check, *check.ceiling)
        elif now >= deadline:
            return total
        elif not told_registering:
            told_registering = True
            _log.info(
                "%s needs %d task slots at once and the cluster has %d so far; waiting up "
                "to %.0fs for executors to register (%s)",
                check.need,
                check.n,
                total,
                deadline - now,
                conf_key("capacity_wait"),
            )
        time.sleep(POLL_INTERVAL)  # executors register with no event Python can wait on


def _refuse_beside_held(check: _Check, total: int) -> None:
    """Refuse where the cluster has slots enough, but not beside the other runs' of this
    process (they free theirs only when they end, which may be hours)."""
    held, n = check.held, check.n
    if held and total >= n and total - held < n:
        raise CapacityError(
            f"{check.need} needs {n} free task slots at once, but other runs of this process "
            f"still going hold {held} of the cluster's {total} slots: wait for them "
            "(handle.result()), cancel one (handle.cancel()), or lower np to "
            f"{(total - held) * check.k} or less"
        )


def _wait_for_busy(
    check: _Check, busy: int, total: int, now: float, busy_deadline: float | None
) -> float:
    """The cluster has slots enough, but other jobs' tasks hold some (those of a job just
    cancelled, a failed run, take a moment to end): the deadline to wait for them, set and
    told the first time; refuse once it has passed."""
    if busy_deadline is None:
        busy_deadline = now + min(check.wait, BUSY_WAIT)
        _log.info(
            "%s: %d of the cluster's %d task slots are busy with other jobs; "
            "waiting up to %.0fs for them to free up",
            check.need,
            busy,
            total,
            busy_deadline - now,
        )
    if now >= busy_deadline:
        raise CapacityError(
            f"{check.need} needs {check.n} free task slots at once, but {busy} of the cluster's "
            f"{total} slots are busy with other jobs; wait for them, or lower np"
        )
    return busy_deadline


def _never_enough(check: _Check, most: int, how: str) -> CapacityError:
    """The application's settings never give it ``check.n`` slots (``most``, found by ``how``)."""
    lower = f"Lower np to {most * check.k} or less, or give" if most > 0 else "Give"
    return CapacityError(
        f"{check.need} needs {check.n} task slots at once (barrier mode), but this application "
        f"can never run more than {most} ({how}). {lower} the application more "
        "executors or cores when it starts (spark.executor.instances, "
        "spark.executor.cores)."
    )


def _too_few(check: _Check, conf: Any, total: int, began: float) -> CapacityError:
    """The wait is over and the cluster has ``total`` slots, too few: what to change."""
    need, n, k = check.need, check.n, check.k
    task_cpus = conf.get("spark.task.cpus", "1")
    gpus = conf.get("spark.task.resource.gpu.amount")
    per_task = f"spark.task.cpus={task_cpus}" + (
        f", spark.task.resource.gpu.amount={gpus}" if gpus else ""
    )
    if check.promised_from_now:
        assert check.ceiling is not None
        most, how = check.ceiling
        lower = f", or lower np to {total * k} or less" if total > 0 else ""
        return CapacityError(
            f"{need} needs {n} task slots at once (barrier mode). This application's settings "
            f"give it {most} ({how}), but the cluster has {total} after waiting "
            f"{time.time() - began:.0f}s: the executors missing are still starting (a busy "
            "host can take minutes) or cannot start (see their logs, e.g. the Spark UI's "
            f"Executors tab). Raise capacity_wait ({conf_key('capacity_wait')}, now "
            f"{check.wait:g}s){lower}."
        )
    lower = f"Lower np to {total * k} or less, or add" if total > 0 else "Add"
    return CapacityError(
        f"{need} needs {n} task slots at once (barrier mode), but the cluster has {total} "
        f"({per_task}, master {check.sc.master}). {lower} executors or cores "
        "(spark.executor.instances, spark.executor.cores)."
    )
