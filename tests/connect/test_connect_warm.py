"""Warm starts from a Spark Connect session: later runs fork their ranks from the zygote, also
after another job's tasks changed the environment of the Python workers they share, and after
the Python workers that started the zygotes ended."""

from __future__ import annotations

import functools
import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from sparktrain import SparkRunner
from tests.fixtures import trainers
from tests.helpers import wait_gone

pytestmark = pytest.mark.spark


def _leave_rendezvous_id(rdzv_id: str, batches: Iterator[Any]) -> Iterator[Any]:
    """What a TorchDistributor task does to its Python worker: a per-call rendezvous id."""
    import os

    import pyarrow as pa

    for _ in batches:
        pass
    os.environ["PYSPARK_TORCH_DISTRIBUTOR_RDZV_ID"] = rdzv_id
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})


def _forked(runner: SparkRunner) -> bool:
    record = runner.last_run
    assert record is not None
    return bool(record.attempts[-1].breakdown.get("forked"))


def test_later_connect_runs_fork_after_another_jobs_leftovers(connect):
    runner = SparkRunner(np=2, spark=connect)
    fresh = runner.run(trainers.whoami, tag="first")
    # Real runs until one forks: the first run's task starts its zygote once its ranks end,
    # and a later task that lands on another Python worker of the executor starts cold until
    # that zygote has loaded.
    for _ in range(5):
        runner.run(trainers.whoami, tag="warm")
        if _forked(runner):
            break
    assert _forked(runner), "no Connect run forked its ranks"
    # Another barrier job on the same session's workers, as TorchDistributor runs between calls.
    for _ in range(2):
        leave = functools.partial(_leave_rendezvous_id, uuid.uuid4().hex)
        frame = connect.range(0, 2, 1, 2).mapInArrow(leave, "pid long", barrier=True)
        assert len(frame.collect()) == 2
        warm = runner.run(trainers.whoami, tag="after")
        assert _forked(runner), "a run after another job's tasks started cold"
    assert warm["RANK"] == "0" and warm["pid"] != fresh["pid"]


def _zygote(pid: int) -> bool:
    try:
        return "sparktrain.worker.zygote" in psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return False


def test_connect_runs_fork_after_the_workers_that_started_the_zygotes_ended(connect):
    runner = SparkRunner(np=2, spark=connect)
    for _ in range(6):  # real runs, until every rank forks (see above)
        parents = runner.run_all(trainers.parent)
        if all(_zygote(pid) for pid in parents):
            break
    assert all(_zygote(pid) for pid in parents), "no Connect run forked every rank"
    # End the Python workers that started them, as Spark ends idle workers, or as another
    # job's task (TorchDistributor's) takes a worker that is not reused after it.
    workers = {psutil.Process(pid).ppid() for pid in parents} - {0, 1}
    for worker in workers:
        assert "python" in psutil.Process(worker).name().lower()
        os.kill(worker, signal.SIGKILL)
    wait_gone(sorted(workers), 10.0)
    # Forked by the same zygotes (Spark may place rank 0 on the other executor this time).
    after = runner.run_all(trainers.parent)
    assert sorted(after) == sorted(parents), [(pid, _zygote(pid)) for pid in after]
    assert _forked(runner)
