"""np > 0: one barrier stage of np tasks (np / k with k GPUs per task), in a job group of its
own that we can cancel."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import re
import threading
from collections.abc import Callable
from typing import Any

from sparktrain.shipping.python_probe import executor_python, pin_python
from sparktrain.shipping.spark_errors import describe_spark_error
from sparktrain.task.entry import TaskJob


class SparkLaunch:
    """Runs the barrier stage from a driver thread; :meth:`cancel` cancels its job group.

    Args:
        spark: the SparkSession.
        job: what every task gets.
        description: the Spark job description shown in the UI.
    """

    def __init__(self, spark: Any, job: TaskJob, description: str, frame: Any = None) -> None:
        self.sc = spark.sparkContext
        # A run given a DataFrame: the stage runs over its partitions (see _frame_stage).
        self.frame = frame
        self.job = job
        self.n = job.tasks
        self.group = f"sparktrain-{job.run_id}-{job.attempt}"
        self.description = description

    def start(
        self, done: Callable[[list[dict[str, Any]] | None, BaseException | None], None]
    ) -> None:
        try:
            from pyspark import InheritableThread as Thread
        except ImportError:  # pragma: no cover - pyspark < 3.2
            Thread = threading.Thread  # type: ignore[misc,assignment]  # noqa: N806

        def body() -> None:
            payload = None
            try:
                self.sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
                payload = self.sc.broadcast(self.job.payload)
                job = dataclasses.replace(self.job, payload=b"")
                if self.frame is not None:
                    records = _frame_stage(self.frame, self.n, job, payload)
                else:
                    task = _task(job, payload)
                    rdd = self.sc.parallelize(range(self.n), self.n).barrier().mapPartitions(task)
                    pin_python(rdd, self.sc, executor_python(self.sc)[0])
                    records = rdd.collect()
            except BaseException as exc:  # noqa: BLE001 - handed to the monitor
                _destroy(payload)
                done(None, exc)
            else:
                _destroy(payload)
                done(records, None)

        Thread(target=body, name="sparktrain-stage", daemon=True).start()

    def cancel(self) -> None:
        """Cancel the job group; running tasks are interrupted and their workers die with them."""
        try:
            self.sc.cancelJobGroup(self.group)
        except Exception:  # noqa: BLE001 - the context may already be stopped
            pass

    def describe_error(self, error: BaseException) -> str:
        return describe_spark_error(error)

    def failed_task(self, error: BaseException) -> FailedTask | None:
        return failed_task(error, self.job.ranks_per_task)


def _task(job: TaskJob, payload: Any) -> Callable[[Any], Any]:
    """The body of every barrier task: ``job`` without its payload, which ``payload`` carries.

    PySpark turns a pickled closure over about 1 MiB into a broadcast, written to files under
    the driver's and executors' temporary folders, and ``job`` holds the run's key: so the
    payload (which holds none) travels in a broadcast of its own, and the closure stays small
    and in memory.
    """

    def task(iterator: Any) -> Any:
        from sparktrain.task.entry import run_spark_task

        return run_spark_task(dataclasses.replace(job, payload=payload.value), iterator)

    return task


def _frame_stage(frame: Any, n: int, job: TaskJob, payload: Any) -> list[dict[str, Any]]:
    """The barrier stage over ``frame`` (a :class:`~sparktrain.driver.frame_input.StageFrame`)
    in ``n`` partitions: ``mapInArrow(barrier=True)`` hands each task its partition's Arrow
    batches, which it streams to its ranks; its records come back as rows of one binary
    column, as from a Spark Connect session."""
    from sparktrain.shipping.python_probe import sparktrain_python
    from sparktrain.task.connect_stage import RECORD_COLUMN, record_schema

    with sparktrain_python(frame.frame.sparkSession, check=False):
        stage = frame.partitioned(n).mapInArrow(
            functools.partial(_frame_task, job, payload), record_schema(), barrier=True
        )
    return [pickle.loads(row[RECORD_COLUMN]) for row in stage.collect()]


def _frame_task(job: TaskJob, payload: Any, batches: Any) -> Any:
    from sparktrain.task.connect_stage import run_connect_task

    return run_connect_task(dataclasses.replace(job, payload=payload.value), batches)


def _destroy(broadcast: Any) -> None:
    """Remove a broadcast's files and blocks, now that its job has ended."""
    if broadcast is None:
        return
    try:
        broadcast.destroy()
    except Exception:  # noqa: BLE001 - the context may already be stopped
        pass


@dataclasses.dataclass(frozen=True)
class FailedTask:
    """The Spark task a job failure names: its index (partition), host, executor and why."""

    index: int
    host: str
    executor: str
    reason: str = ""


_LOST_TASK = re.compile(
    r"Lost task (\d+)\.\d+ in stage [\d.]+ \(TID \d+\) \((\S+) executor ([^)\s]+)\)"
    r"(?:: ([^\n]*))?"
)


def failed_task(error: BaseException, ranks_per_task: int = 1) -> FailedTask | None:
    """The task that made a Spark job fail, when Spark's message names it.

    Its ``index`` is that of its first slot (see :class:`~sparktrain.layout.cluster.TaskInfo`):
    Spark's partition times ``ranks_per_task``.
    """
    found = _LOST_TASK.search(str(error))
    if found is None:
        return None
    reason = (found.group(4) or "").strip()[:500]
    index = int(found.group(1)) * ranks_per_task
    return FailedTask(index, found.group(2), found.group(3), reason)
