"""Stopping a run never costs the cluster an executor, in whatever phase the stop lands.

Each phase is stopped 20 times in a row on the shared session; the executors (host and port
of each executor process) must be the same ones afterwards: a cancelled barrier task that
crashed its executor would show up as an executor replaced.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sparktrain import RendezvousTimeoutError, RunTimeoutError, SparkRunner, WorkerFailedError
from tests.fixtures import trainers
from tests.helpers import alive, recorded_pids

ROUNDS = 20

pytestmark = pytest.mark.slow


def executors(spark: Any) -> list[str]:
    """``host:port`` of every executor process (and the driver's block manager)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sorted(f"{info.host()}:{info.port()}" for info in infos)


def _rendezvous(tmp: Path) -> None:
    def hang_task_1(index: int) -> None:  # nested: pickled by value, as executors need
        if index == 1:
            time.sleep(600)

    runner = SparkRunner(np=2, start_timeout=4, grace_period=1)
    runner._pre_rendezvous_hook = hang_task_1
    with pytest.raises(RendezvousTimeoutError) as info:
        runner.run(trainers.noop)
    assert info.value.missing == [1]


def _training(tmp: Path) -> None:
    with pytest.raises(RunTimeoutError):
        SparkRunner(np=2, timeout=2, grace_period=1).run(trainers.block_forever, str(tmp))
    assert alive(recorded_pids(tmp)) == []


def _collective(tmp: Path) -> None:
    with pytest.raises(WorkerFailedError, match="injected failure on rank 1"):
        SparkRunner(np=2, grace_period=1).run(trainers.fail_on_rank, str(tmp), "raise")
    assert alive(recorded_pids(tmp)) == []


def _finished(tmp: Path) -> None:
    assert SparkRunner(np=2).run(trainers.noop) == 0


@pytest.mark.parametrize(
    "phase",
    [_rendezvous, _training, _collective, _finished],
    ids=["rendezvous", "training", "collective", "teardown"],
)
def test_stopping_twenty_times_loses_no_executor(spark, tmp_path, phase):
    # One run first: the executors have registered and their Python workers are warm, so
    # each round below is decided by its phase, not by a cold start.
    assert SparkRunner(np=2).run(trainers.noop) == 0
    before = executors(spark)
    assert len(before) == 3  # the driver and two executors
    for i in range(ROUNDS):
        folder = tmp_path / str(i)
        folder.mkdir()
        phase(folder)
        assert executors(spark) == before, f"an executor was replaced in round {i + 1}"
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
