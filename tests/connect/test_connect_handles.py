"""Runs that do not block, every rank's value and the ``@distributed`` decorator from a Spark
Connect session: ``submit`` and its handle (result, logs, cancel), ``run_all``."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from sparktrain import RunHandle, SparkRunner, distributed
from tests.fixtures import trainers
from tests.helpers import alive, recorded_pids, wait_for

pytestmark = pytest.mark.spark


def _said(handle: RunHandle, text: str) -> int:
    return sum(text in line for line in handle.logs())


def test_submit_returns_a_handle_whose_result_is_rank0s_value(connect, capsys):
    handle = SparkRunner(np=2, spark=connect).submit(trainers.whoami, tag="sub")
    assert isinstance(handle, RunHandle)
    result = handle.result(300)
    assert result["RANK"] == "0" and result["WORLD_SIZE"] == "2" and result["tag"] == "sub"
    assert handle.status() == "done"
    assert _said(handle, "[rank 0] hello from rank 0 sub") == 1
    assert _said(handle, "[rank 1] hello from rank 1 sub") == 1
    # A submitted run's lines stay in its handle until follow() asks for them.
    assert "hello from rank" not in capsys.readouterr().out
    assert handle.last_run is not None and handle.last_run.succeeded


def test_cancel_stops_every_rank_and_frees_the_slots(connect, tmp_path: Path):
    handle = SparkRunner(np=2, spark=connect, grace_period=1).submit(
        trainers.block_in_collective, str(tmp_path)
    )
    wait_for(lambda: _said(handle, "in the collective") == 2, 300, "both ranks' lines")
    pids = recorded_pids(tmp_path)
    assert len(alive(pids)) == 2 and not handle.done()
    assert handle.cancel() is True
    assert handle.cancelled() and handle.done()
    with pytest.raises(concurrent.futures.CancelledError):
        handle.result(0)
    assert alive(pids) == []
    assert handle.last_run is not None
    assert handle.last_run.attempts[-1].cause == "cancelled; every rank was stopped."
    # The cancelled stage holds no slot: a run needing both of the cluster's slots starts
    # (else its barrier stage would wait, and start_timeout would end it with an error).
    placed = SparkRunner(np=2, spark=connect, start_timeout=120).run_all(trainers.placed)
    assert [rank for rank, _, _ in placed] == [0, 1]
    assert not set(pids) & {pid for _, _, pid in placed}


def test_distributed_decorator_runs_every_rank_and_submits(connect):
    where = distributed(np=2, spark=connect)(trainers.whereabouts)
    assert where("here") == (0, 1, "here")  # a plain call is ordinary Python
    assert where.distributed("there") == [(0, 2, "there"), (1, 2, "there")]

    later = distributed(np=2, spark=connect, remote=True)(trainers.whereabouts)
    handle = later.distributed("later")
    assert isinstance(handle, RunHandle)
    assert handle.result(300) == [(0, 2, "later"), (1, 2, "later")]


def test_a_submitted_run_waits_its_turn_for_the_slots_the_conf_gives(connect, tmp_path: Path):
    release = tmp_path / "release"
    runner = SparkRunner(np=2, spark=connect)
    first = runner.submit(trainers.talk_until, str(release), 1)
    wait_for(lambda: _said(first, "line 0") == 2, 300, "both ranks of the first run")
    second = runner.submit(trainers.whereabouts, "second")
    # The server's conf gives 2 slots (local-cluster[2,1,1024]), which the first run holds.
    waiting = "waiting for 2 task slots (other runs of this process hold 2 of the cluster's 2)"
    wait_for(lambda: second.status().startswith(waiting), 60, "the second run in line")
    assert second.status() == f"{waiting}, 1st in line"
    release.touch()
    assert first.result(300) == 0
    assert second.result(300) == (0, 2, "second")
