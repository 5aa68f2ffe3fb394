"""SparkRunner and HorovodRunner from a Spark Connect session, against a real Connect server
whose executors are separate JVMs: results, logs, failures, restarts, timeouts, interrupts."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from sparktrain import HorovodRunner, PayloadError, RunTimeoutError, SparkRunner, WorkerFailedError
from sparktrain.backends.horovod_install import horovod_torch_library
from tests.fixtures import hvd_trainers, resumable, trainers
from tests.helpers import (
    alive,
    interrupt_once_started,
    recorded_pids,
    timed_out_while_running,
)

pytestmark = pytest.mark.spark


def test_ddp_returns_rank0_value_and_streams_logs(connect, capsys):
    result = SparkRunner(np=2, spark=connect).run(trainers.whoami, tag="c")
    assert result["RANK"] == "0" and result["WORLD_SIZE"] == "2" and result["tag"] == "c"
    out = capsys.readouterr().out
    assert "[rank 0] hello from rank 0 c" in out
    assert "[rank 1] hello from rank 1 c" in out
    # Each rank ran in a task of its own executor JVM, not in this process.
    assert result["pid"] != os.getpid()


def test_allreduce_over_gloo(connect):
    assert SparkRunner(np=2, spark=connect).run(trainers.allreduce_sum) == 3.0


@pytest.mark.horovod
@pytest.mark.skipif(
    horovod_torch_library() is None or importlib.util.find_spec("horovod") is None,
    reason="horovod.torch is not importable: build it with scripts/install-horovod.sh",
)
def test_horovod_gloo(connect, tmp_path):
    result = HorovodRunner(np=2, spark=connect, launcher="gloo").run(
        hvd_trainers.train_hvd, learning_rate=0.1, num_epochs=1, checkpoint_dir=str(tmp_path)
    )
    assert result["size"] == 2


def test_failed_rank_shows_root_cause_and_stops_every_rank(connect, tmp_path):
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, spark=connect, grace_period=2).run(
            trainers.fail_on_rank, str(tmp_path), "raise"
        )
    message = str(info.value)
    assert info.value.root_cause.rank == 1
    assert "raised RuntimeError: injected failure on rank 1" in message
    assert "Traceback" in message and "about to fail" in message
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


def test_killed_rank_restarts_and_resumes(connect, tmp_path):
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    logs.mkdir()
    runner = SparkRunner(np=2, spark=connect, max_restarts=1, grace_period=2)
    result = runner.run(
        resumable.resumable, str(ckpt), str(logs), epochs=2, steps_per_epoch=2, kill_at=(1, 1)
    )
    assert result == {"steps": 4, "size": 2, "attempt": 1}
    assert [a.attempt for a in runner.attempts] == [0, 1]
    assert "SIGKILL" in runner.attempts[0].cause


def test_timeout_stops_every_rank(connect, tmp_path):
    def attempt(pid_dir: Path, timeout: float) -> RunTimeoutError:
        with pytest.raises(RunTimeoutError, match=f"timeout={timeout:g}s") as info:
            SparkRunner(np=2, spark=connect, timeout=timeout, grace_period=1).run(
                trainers.block_forever, str(pid_dir)
            )
        assert alive(recorded_pids(pid_dir)) == []
        return info.value

    error = timed_out_while_running(attempt, tmp_path, (6, 15, 40, 100))
    assert "in block_forever at trainers.py:" in str(error)


def test_interrupt_stops_every_rank_and_the_job(connect, tmp_path):
    interrupt_once_started(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        SparkRunner(np=2, spark=connect, grace_period=1).run(trainers.block_forever, str(tmp_path))
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []
    # The session is usable at once: the job of the run is gone, not queued in front.
    assert connect.range(3).count() == 3


def test_horovod_runner_run_all_returns_every_ranks_value(connect):
    placed = HorovodRunner(np=2, spark=connect).run_all(trainers.placed)
    assert [rank for rank, _, _ in placed] == [0, 1]
    assert os.getpid() not in {pid for _, _, pid in placed}


def test_a_warm_call_makes_two_round_trips_and_the_session_conf_applies(connect, monkeypatch):
    # Every conf read and plan analysis of a Connect client is a round trip to the server. A
    # warm call takes one snapshot of the conf (getAll) and runs its job: nothing else.
    from pyspark.sql.connect.client.core import SparkConnectClient

    trips: list[str] = []
    for name in ("config", "_analyze", "_execute_and_fetch", "execute_command"):
        real = getattr(SparkConnectClient, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            trips.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(SparkConnectClient, name, counted)
    runner = SparkRunner(np=2, spark=connect, progress=False)
    assert runner.run(trainers.whoami, tag="first")["tag"] == "first"  # plans the session
    trips.clear()
    assert runner.run(trainers.whoami, tag="warm")["tag"] == "warm"
    assert sorted(trips) == ["_execute_and_fetch", "config"]
    connect.conf.set("spark.sparktrain.maxPayloadBytes", "1024")
    try:
        with pytest.raises(PayloadError) as info:
            runner.run(trainers.whoami, tag="x" * 4096)
    finally:
        connect.conf.unset("spark.sparktrain.maxPayloadBytes")
    assert "spark.sparktrain.maxPayloadBytes" in str(info.value)
    assert runner.run(trainers.whoami, tag="after")["tag"] == "after"
