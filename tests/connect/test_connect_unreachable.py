"""A Connect client that the executors cannot reach (a laptop, a remote notebook): the run
still works through the Spark job alone. Simulated by advertising 255.255.255.255, which a
TCP connection refuses at once without sending anything."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sparktrain import RunTimeoutError, SparkRunner, WorkerFailedError
from tests.fixtures import trainers
from tests.helpers import alive, recorded_pids, timed_out_while_running, wait_gone

pytestmark = pytest.mark.spark

UNREACHABLE = "255.255.255.255"


def test_unreachable_client_is_detected_and_the_run_still_returns(connect, tmp_path, caplog):
    logs = tmp_path / "logs"
    runner = SparkRunner(np=2, spark=connect, client_address=UNREACHABLE, log_dir=str(logs))
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        result = runner.run(trainers.allreduce_sum)
    assert result == 3.0
    assert f"executors cannot reach this client at {UNREACHABLE}" in caplog.text
    assert "no live output or progress from the ranks" in caplog.text
    # The first stage's tasks found it out before any rank started: the run started again,
    # detached, as the same attempt.
    assert [a.attempt for a in runner.last_run.attempts] == [0]
    # The session's next run starts detached at once, without trying to reach the client.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        assert runner.run(trainers.allreduce_sum) == 3.0
    assert f"executors cannot reach this client at {UNREACHABLE}" not in caplog.text
    assert "no live output or progress from the ranks" in caplog.text


def test_detached_output_goes_to_the_log_dir(connect, tmp_path, capsys):
    logs = tmp_path / "logs"
    runner = SparkRunner(np=2, spark=connect, client_reachable=False, log_dir=str(logs))
    result = runner.run(trainers.whoami, tag="d")
    assert result["RANK"] == "0" and result["tag"] == "d"
    assert "[rank 0]" not in capsys.readouterr().out  # no live logs: they are in files
    (run,) = logs.iterdir()
    for rank in (0, 1):
        text = (run / "attempt-1" / f"rank-{rank}.log").read_text()
        assert f"hello from rank {rank} d" in text


def test_detached_failure_brings_back_root_cause_and_output(connect, tmp_path):
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, spark=connect, client_reachable=False, grace_period=2).run(
            trainers.fail_on_rank, str(tmp_path), "raise"
        )
    message = str(info.value)
    assert info.value.root_cause.rank == 1
    assert "raised RuntimeError: injected failure on rank 1" in message
    assert "Traceback" in message and "fail_on_rank" in message
    assert "about to fail" in message  # the failed rank's last lines
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


def test_a_detached_failure_arrives_once_the_other_ranks_ended(connect, tmp_path):
    """Rank 0 takes 3 s to end after rank 1 failed: the failed task waits for it, so no rank
    is left running when the client gets the error (the job's error does not wait for the
    other tasks' kill)."""
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, spark=connect, client_reachable=False, grace_period=2).run(
            trainers.slow_to_end_after_a_peer_fails, str(tmp_path), 3.0
        )
    assert info.value.root_cause.rank == 1
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


def test_detached_timeout_stops_every_rank(connect, tmp_path):
    def attempt(pid_dir: Path, timeout: float) -> None:
        with pytest.raises(RunTimeoutError, match=f"timeout={timeout:g}s"):
            SparkRunner(
                np=2, spark=connect, client_reachable=False, timeout=timeout, grace_period=1
            ).run(trainers.block_forever, str(pid_dir))
        # The cancelled tasks' Python workers are killed; their ranks follow them (parent
        # watch).
        wait_gone(recorded_pids(pid_dir), timeout=30)

    timed_out_while_running(attempt, tmp_path, (6, 15, 40, 100))


def test_detached_run_all_brings_back_every_ranks_value(connect, tmp_path):
    # Without the channel, every rank's value comes back in its task's row of the job.
    runner = SparkRunner(np=2, spark=connect, client_reachable=False, progress=False)
    placed = runner.run_all(trainers.placed)
    assert [rank for rank, _, _ in placed] == [0, 1]
    assert len({pid for _, _, pid in placed}) == 2
