"""Warm starts from a Spark Connect session: later runs fork their ranks from the zygote, also
after another job's tasks changed the environment of the Python workers they share."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sparktrain import SparkRunner
from tests.fixtures import trainers

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
    for _ in range(5):  # real runs, until the zygote that loads beside them is ready
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
