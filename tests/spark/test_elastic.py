"""Elastic runs on the shared local-cluster session: the size each attempt gets from the free
task slots, a real executor taken away mid-run and given back, and a min that no longer fits.

An executor is taken away with ``SparkContext.killExecutor``, which (unlike a crash) tells the
cluster manager not to replace it: the capacity stays lost until the test asks for it back
with ``requestTotalExecutors``, so what the run sees does not depend on how fast a worker restarts
an executor. Every test gives the session its two executors back before it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparktrain import CapacityError, HorovodRunner, SparkRunner
from sparktrain.examples import _elastic_cluster
from tests.conftest import _local_executor_logs, wait_for_executors
from tests.fixtures import elastic_trainers
from tests.helpers import RANKS_START, settled_tracker, wait_for, wait_for_files, wait_gone

pytestmark = pytest.mark.spark


def executor_ids(spark: Any) -> list[str]:
    return _elastic_cluster.executor_ids(spark.sparkContext)


def want_executors(spark: Any, count: int) -> None:
    """Ask the cluster manager for ``count`` executors in all (it starts the missing ones)."""
    assert _elastic_cluster.request_executors(spark.sparkContext, count)


@pytest.fixture
def take_executor(spark: Any) -> Iterator[Any]:
    """A function that takes one executor away (not replaced); both are back afterwards."""
    sc = spark.sparkContext._jsc.sc()
    taken: list[str] = []

    def take() -> str:
        victim = executor_ids(spark)[-1]
        assert sc.killExecutor(victim), f"Spark refused to kill executor {victim}"
        taken.append(victim)
        wait_for(lambda: victim not in executor_ids(spark), 60, f"executor {victim} gone")
        return victim

    yield take
    if taken:
        want_executors(spark, 2)
    wait_for_executors(spark, 2, 120, lambda: _local_executor_logs(spark))


def test_starts_with_the_free_slots_when_max_does_not_fit(spark):
    runner = SparkRunner(np=(1, 4))
    seen = runner.run_all(elastic_trainers.sizes_seen)
    assert [s["world_size"] for s in seen] == [2, 2]
    assert [s["rank"] for s in seen] == [0, 1]
    assert {s["elastic"] for s in seen} == {"1"} and {s["previous"] for s in seen} == {"2"}
    assert runner.last_run.sizes == [2]
    assert "free task slots" in runner.last_run.attempts[0].size_reason


def test_horovod_runner_sizes_follow_the_chosen_size(spark):
    runner = HorovodRunner(np=(1, 3))
    seen = runner.run_all(elastic_trainers.horovod_sizes)
    # Both executors of the test cluster are on one host: one node of 2 ranks.
    assert seen == [(2, 2, "2"), (2, 2, "2")]
    assert runner.last_run.sizes == [2]


# Two starts (RANKS_START each) and the grown attempt's result (180 s) on a busy machine.
@pytest.mark.timeout(660, func_only=True)
def test_lost_executor_goes_on_smaller_then_grows_back_at_a_checkpoint(
    spark, take_executor, tmp_path, caplog
):
    marks = tmp_path / "marks"
    marks.mkdir()
    runner = SparkRunner(
        np=(1, 2), max_restarts=1, resize_interval=1, grace_period=5, progress=False
    )
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        handle = runner.submit_all(
            elastic_trainers.shrink_and_grow, str(tmp_path / "ckpt"), str(marks)
        )
        wait_for_files(marks, "attempt0.rank*", 2, timeout=RANKS_START, handle=handle)
        take_executor()
        wait_for_files(marks, "attempt1.rank0", 1, timeout=RANKS_START, handle=handle)
        assert handle.status() == "running on 1 rank (np=(1, 2))"
        assert handle.sizes == [2, 1]
        want_executors(spark, 2)  # the executor comes back: the run grows at a checkpoint
        result = handle.result(timeout=180)
    record = handle.last_run
    assert record.sizes == [2, 1, 2]
    first, smaller, larger = record.attempts
    assert "vanished" in first.cause or "lost" in first.cause
    assert smaller.resized and "grow from 1 to 2 ranks" in smaller.cause
    assert "restart 1/1" in smaller.size_reason
    assert larger.error is None and larger.size_reason == smaller.cause
    # The larger attempt took up the newest checkpoint and was told the size before it; two
    # relaunches with max_restarts=1: the grow was not counted as a restart.
    step = int((marks / "attempt1.rank0").read_text().split()[2])
    assert result[0] == {"size": 2, "previous": 1, "step": result[0]["step"]}
    assert result[0]["step"] > step and result[1]["step"] == result[0]["step"]
    assert "elastic run np=(1, 2): 1 rank (was 2)" in caplog.text
    assert "elastic run np=(1, 2): 2 ranks (was 1): grow from 1 to 2" in caplog.text


# A start (RANKS_START) and the failure (180 s) on a busy machine.
@pytest.mark.timeout(480, func_only=True)
def test_min_larger_than_what_is_left_fails_after_capacity_wait(spark, take_executor, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    runner = SparkRunner(np=(2, 2), max_restarts=1, capacity_wait=3, grace_period=5)
    handle = runner.submit_all(elastic_trainers.shrink_and_grow, str(tmp_path / "c"), str(marks))
    wait_for_files(marks, "attempt0.rank*", 2, timeout=RANKS_START, handle=handle)
    pids = [int(p.read_text().split()[3]) for p in sorted(marks.glob("attempt0.rank*"))]
    take_executor()
    with pytest.raises(CapacityError) as info:
        handle.result(timeout=180)
    text = str(info.value)
    assert "did not come back within capacity_wait=3s" in text
    assert "np=2 needs 2 task slots at once" in text and "the cluster has 1" in text
    assert handle.last_run.sizes == [2]  # the restart never launched
    wait_gone(pids)  # the surviving rank was stopped, not left behind
    tracker = settled_tracker(spark)
    assert tracker.getActiveStageIds() == []
    assert not list(Path(tmp_path / "marks").glob("attempt1.*"))
