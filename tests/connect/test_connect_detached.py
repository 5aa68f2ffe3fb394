"""Detached runs (executors cannot reach the Connect client: no channel, results and failures
in the Spark job's rows) with Horovod's MPI launcher, and with restarts after a killed rank."""

from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sparktrain import HorovodRunner, SparkRunner, WorkerFailedError
from sparktrain.backends.horovod_install import _links_mpi, horovod_torch_library
from tests.fixtures import hvd_trainers, resumable, trainers
from tests.helpers import alive, recorded_pids

pytestmark = pytest.mark.spark

_LIBRARY = horovod_torch_library()

_NEEDS_MPI = [
    pytest.mark.horovod,
    pytest.mark.skipif(
        _LIBRARY is None or importlib.util.find_spec("horovod") is None,
        reason="horovod.torch is not importable: build it with scripts/install-horovod.sh",
    ),
    pytest.mark.skipif(
        _LIBRARY is None or shutil.which("mpirun") is None or not _links_mpi(_LIBRARY),
        reason="Horovod's MPI launcher needs Open MPI's mpirun and Horovod built with MPI "
        "(apt-get install openmpi-bin libopenmpi-dev; HOROVOD_FORCE=1 scripts/install-horovod.sh)",
    ),
]


def needs_mpi(test: Callable[..., None]) -> Callable[..., None]:
    """Mark ``test`` as needing Horovod built with MPI, and Open MPI's mpirun."""
    for mark in _NEEDS_MPI:
        test = mark(test)
    return test


def epoch_log(folder: Path, rank: int) -> list[tuple[int, int, int]]:
    """(attempt, epoch, steps before the epoch) for every epoch the rank started."""
    lines = (folder / f"rank{rank}.log").read_text().split("\n")
    return [tuple(int(v) for v in line.split()) for line in lines if line]  # type: ignore[misc]


# -- Horovod's MPI launcher -------------------------------------------------------------------


@needs_mpi
def test_detached_mpi_allreduce_returns_and_logs_each_rank(connect, tmp_path, capsys):
    logs = tmp_path / "logs"
    runner = HorovodRunner(
        np=2, spark=connect, launcher="mpi", client_reachable=False, log_dir=str(logs)
    )
    assert runner.run(hvd_trainers.allreduce_sum, "mpi-d") == 3.0  # 1 + 2
    assert "[rank 0]" not in capsys.readouterr().out  # no live logs: they are in files
    (run,) = logs.iterdir()
    for rank in (0, 1):
        text = (run / "attempt-1" / f"rank-{rank}.log").read_text()
        assert f"hvd rank {rank} of 2 mpi-d" in text


@needs_mpi
def test_detached_mpi_failure_names_the_root_cause_and_stops_every_rank(connect, tmp_path):
    # mpirun ends every rank once one fails, and the other task holds no rank: the error
    # comes back without waiting out a grace period (an hour here; else the timeout ends it).
    runner = HorovodRunner(
        np=2, spark=connect, launcher="mpi", client_reachable=False, grace_period=3600, timeout=90
    )
    with pytest.raises(WorkerFailedError) as info:  # rank 0's allreduce would wait forever
        runner.run(hvd_trainers.fail_in_allreduce_loop, str(tmp_path), "raise")
    message = str(info.value)
    assert info.value.root_cause.rank == 1
    assert "raised RuntimeError: injected failure on rank 1" in message
    assert "Traceback" in message and "about to fail" in message
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


# -- restarts -----------------------------------------------------------------------------------


def test_detached_killed_rank_restarts_from_the_checkpoint(connect, tmp_path, caplog):
    ckpt, epochs = tmp_path / "ckpt", tmp_path / "epochs"
    epochs.mkdir()
    runner = SparkRunner(
        np=2, spark=connect, client_reachable=False, max_restarts=1, grace_period=2
    )
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        result = runner.run(
            resumable.resumable,
            str(ckpt),
            str(epochs),
            epochs=2,
            steps_per_epoch=2,
            kill_at=(1, 1),  # rank 1, attempt 0: SIGKILL in epoch 1
        )
    assert result == {"steps": 4, "size": 2, "attempt": 1}
    # Epoch 1 ran again from epoch 0's checkpoint (2 steps in), on both ranks.
    for rank in (0, 1):
        assert epoch_log(epochs, rank) == [(0, 0, 0), (0, 1, 2), (1, 1, 2)]
    first, second = runner.attempts
    assert first.cause.startswith("rank 1 ") and "SIGKILL" in first.cause
    assert second.error is None
    assert f"attempt 1/2 failed: {first.cause}; starting attempt 2/2" in caplog.text


def test_detached_killed_rank_without_restarts_names_the_lost_rank(connect, tmp_path, caplog):
    ckpt, epochs = tmp_path / "ckpt", tmp_path / "epochs"
    epochs.mkdir()
    runner = SparkRunner(
        np=2, spark=connect, client_reachable=False, max_restarts=0, grace_period=2
    )
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        with pytest.raises(WorkerFailedError) as info:
            runner.run(
                resumable.resumable,
                str(ckpt),
                str(epochs),
                epochs=2,
                steps_per_epoch=2,
                kill_at=(1, 1),
            )
    assert info.value.root_cause.rank == 1
    assert "rank 1 " in str(info.value) and "killed by SIGKILL" in str(info.value)
    assert len(runner.attempts) == 1
    assert "starting attempt" not in caplog.text
    assert epoch_log(epochs, 0) == [(0, 0, 0), (0, 1, 2)]  # no second attempt ran


# -- a failure beside a task whose rank returned ----------------------------------------------


def test_detached_failure_after_a_peer_returned_does_not_wait_out_the_grace_period(
    connect, tmp_path
):
    # Rank 0 returns; rank 1 then raises. Its task's error goes out once rank 0's task has
    # ended too, not after the grace period (an hour here; else the timeout ends the run).
    runner = SparkRunner(np=2, spark=connect, client_reachable=False, grace_period=3600, timeout=90)
    with pytest.raises(WorkerFailedError) as info:
        runner.run_all(trainers.finishes_as_its_peer_fails, str(tmp_path))
    assert info.value.root_cause.rank == 1
    assert "raised ValueError: rank 1 could not find its data" in str(info.value)
