"""max_restarts: lost ranks cost a relaunch, never the run; user exceptions fail at once."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparktrain import RunTimeoutError, SparkRunner, WorkerFailedError
from sparktrain.checkpoint import load_latest
from tests.conftest import ranks
from tests.fixtures import resumable
from tests.helpers import timed_out_while_running, wait_for

ROOT = Path(__file__).resolve().parents[2]
HOROVOD = importlib.util.find_spec("horovod") is not None

backends = pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param(
            "horovod",
            marks=[
                pytest.mark.horovod,
                pytest.mark.skipif(
                    not HOROVOD,
                    reason="Horovod is not installed (scripts/install-horovod.sh builds it)",
                ),
            ],
        ),
    ],
)


def epoch_log(log_dir: Path, rank: int = 0) -> list[tuple[int, int, int]]:
    """(attempt, epoch, steps before the epoch) for every epoch the rank started."""
    lines = (log_dir / f"rank{rank}.log").read_text().split("\n")
    return [tuple(int(v) for v in line.split()) for line in lines if line]  # type: ignore[misc]


@backends
def test_killed_rank_restarts_and_resumes_exact_steps(mode, backend, tmp_path, caplog):
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    logs.mkdir()
    runner = SparkRunner(np=ranks(mode, 2), backend=backend, max_restarts=2, grace_period=2)
    result = runner.run(
        resumable.resumable,
        str(ckpt),
        str(logs),
        backend=backend,
        epochs=4,
        steps_per_epoch=5,
        kill_at=(2, 2),
    )
    # 4 epochs x 5 steps, exactly: epoch 2 restarted from its checkpoint, nothing repeated.
    assert result == {"steps": 20, "size": 2, "attempt": 1}
    assert epoch_log(logs) == [(0, 0, 0), (0, 1, 5), (0, 2, 10), (1, 2, 10), (1, 3, 15)]
    first, second = runner.attempts  # the failed one, then the one that finished
    assert "rank 1" in first.cause and "SIGKILL" in first.cause
    assert second.error is None and second.cause is None
    assert {"submit", "rendezvous", "training", "teardown"} <= set(second.phases)
    assert "attempt 1/3 failed" in caplog.text


def test_user_exception_fails_at_once(mode, tmp_path):
    def raises_once(marker: str) -> None:
        import sparktrain

        with open(f"{marker}.{sparktrain.rank()}", "a") as fh:
            fh.write("run\n")
        if sparktrain.rank() == 1:
            raise ValueError("a bug in the training code")

    runner = SparkRunner(np=ranks(mode, 2), max_restarts=2, grace_period=1)
    with pytest.raises(WorkerFailedError, match="a bug in the training code"):
        runner.run(raises_once, str(tmp_path / "runs"))
    assert (tmp_path / "runs.1").read_text() == "run\n"  # no second attempt
    assert len(runner.attempts) == 1


def test_user_exception_restarts_when_asked(mode, tmp_path):
    def raises_in_first_attempt() -> int:
        import sparktrain

        if sparktrain.attempt() == 0 and sparktrain.rank() == 1:
            raise ConnectionError("flaky storage")
        return sparktrain.attempt()

    runner = SparkRunner(
        np=ranks(mode, 2), max_restarts=1, restart_on_user_error=True, grace_period=1
    )
    assert runner.run(raises_in_first_attempt) == 1
    assert "ConnectionError: flaky storage" in runner.attempts[0].cause


def test_gives_up_after_max_restarts(mode):
    def always_killed() -> None:
        import os
        import signal

        import sparktrain

        if sparktrain.rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    runner = SparkRunner(np=ranks(mode, 2), max_restarts=1, grace_period=1)
    with pytest.raises(WorkerFailedError, match="SIGKILL"):
        runner.run(always_killed)
    assert len(runner.attempts) == 2


def test_should_stop_gives_a_grace_period(mode, tmp_path):
    def saves_when_told(out: str) -> None:
        import os
        import time

        import sparktrain

        with open(f"{out}/{sparktrain.rank()}.started", "w") as fh:
            fh.write(str(os.getpid()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sparktrain.should_stop():
                with open(f"{out}/{sparktrain.rank()}.saved", "w") as fh:
                    fh.write("saved")
                return
            time.sleep(0.05)

    def attempt(folder: Path, timeout: float) -> None:
        with pytest.raises(RunTimeoutError):
            SparkRunner(np=ranks(mode, 2), timeout=timeout, grace_period=5).run(
                saves_when_told, str(folder)
            )
        # Every rank that had started was told to stop, and saved in its grace period.
        started = sorted(p.stem for p in folder.glob("*.started"))
        assert sorted(p.stem for p in folder.glob("*.saved")) == started
        assert all(p.read_text() == "saved" for p in folder.glob("*.saved"))

    # The timeout must fire once both ranks run (see timed_out_while_running).
    timed_out_while_running(attempt, tmp_path, (8, 20, 50), pattern="*.started")


@pytest.mark.spark
@pytest.mark.slow
def test_lost_executor_restarts_on_replacement(tmp_path):
    """Kill an executor JVM mid-training; the run goes on, on the replacement executor.

    Runs in its own Spark application (a subprocess), so the shared session keeps its
    executors."""
    script = ROOT / "tests" / "fixtures" / "scripts" / "executor_loss_job.py"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "RESULT {'steps': 20, 'size': 2, 'attempt': 1}" in proc.stdout
    # sparktrain's own messages go through logging: on stderr, prefixed like this.
    assert "sparktrain: attempt 1/3 failed" in proc.stderr
    log = epoch_log(tmp_path / "logs")
    assert log == [(0, 0, 0), (0, 1, 5), (0, 2, 10), (1, 2, 10), (1, 3, 15)]


@pytest.mark.spark
def test_a_run_waits_for_the_replacement_of_an_executor_lost_between_runs(spark, caplog):
    """An executor dies between two runs (SIGKILL of its JVM): the next run, on a session
    older than capacity_wait, waits for the replacement its settings promise (local-cluster
    [2,1,1024] starts one) and runs, rather than refusing np=2 because 1 slot is left."""

    # Not tests.fixtures.resumable.executor_jvm: an RDD's function goes through pyspark's own
    # copy of cloudpickle, for which the fixtures are not registered by value, and executors
    # cannot import the tests package.
    def executor_jvm(_: int) -> int:
        import psutil

        for parent in psutil.Process().parents():
            if any("CoarseGrainedExecutorBackend" in part for part in parent.cmdline()):
                return int(parent.pid)
        raise RuntimeError("not under a Spark executor")

    sc = spark.sparkContext
    jsc = sc._jsc.sc()

    def executor_ids() -> set[str]:
        return set(filter(None, jsc.getExecutorIds().mkString(",").split(",")))

    before = executor_ids()
    [jvm] = sc.parallelize([0], 1).map(executor_jvm).collect()
    os.kill(jvm, signal.SIGKILL)
    # The driver has seen the loss once that executor's id is gone (a new one starts in
    # seconds: a JVM that must load Spark and register).
    wait_for(lambda: not before <= executor_ids(), 60, "the executor's loss seen")
    age = time.time() - sc.startTime / 1000.0
    # Shorter than the session's age: before the runner counted the wait from the run's own
    # start, a session this old was judged at once, with whatever had registered by then.
    capacity_wait = max(min(age - 1.0, 240.0), 1.0)
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        result = SparkRunner(np=2, spark=spark, capacity_wait=capacity_wait).run(lambda: 42)
    assert result == 42
    assert "np=2 needs 2 task slots at once and the cluster has 1 so far" in caplog.text


def test_resume_demo_from_the_readme(capsys, caplog, tmp_path):
    from sparktrain.examples import resume_demo

    args = ["--np", "-2", "--steps-per-epoch", "5", "--checkpoint-dir", str(tmp_path)]
    result = resume_demo.main(args)
    assert result["steps"] == 20 and result["attempt"] == 1
    out = capsys.readouterr().out
    assert "attempt 1/3 failed: rank 1 on 127.0.0.1 was killed by SIGKILL" in caplog.text
    assert "finished in attempt 2 after 1 failure(s)" in out
    # Counted from 1 on the ranks as on the driver: the second attempt is "attempt 2".
    assert "[rank 0] attempt 2: resuming at epoch 2 from the checkpoint of step 10" in out


def printed_table(out: str, title: str) -> list[dict[str, str]]:
    """The rows of a table the demo printed under ``title`` (cells apart by 2+ spaces)."""
    lines = out.split("\n")
    start = lines.index(title)
    header = re.split(r"\s{2,}", lines[start + 1].strip())
    rows = []
    for line in lines[start + 3 :]:
        if not line.strip():
            break
        rows.append(dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


def started_with(variable: str) -> list[int]:
    """The processes whose environment holds ``variable`` (``NAME=value``)."""
    wanted = variable.encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if environ.startswith(wanted) or b"\0" + wanted in environ:
                found.append(int(entry.name))
    return found


@pytest.mark.spark
@pytest.mark.slow
def test_resume_demo_elastic_loses_a_host_and_grows_back(tmp_path):
    """``python -m sparktrain.examples.resume_demo --elastic`` as a user runs it: its own
    local-cluster loses an executor for good mid-epoch and gets it back; every epoch's rows
    are counted once on the ranks, across the three sizes."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir(mode=0o700)
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(private_tmp)}
    env.pop("SPARK_HOME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sparktrain.examples.resume_demo", "--elastic"]
        + ["--checkpoint-dir", str(ckpt)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    attempts = printed_table(out, "Attempts")
    assert [row["ranks"] for row in attempts] == ["2", "1", "2"], out
    lost, smaller, larger = attempts
    assert lost["ended"].endswith("was lost; back to checkpoint 24") and lost["done again"] == "2"
    assert smaller["steps"] == "24 -> 32" and smaller["why this size"] == "restart on what is left"
    assert smaller["ended"] == "stopped to grow after checkpoint 32"
    assert larger["steps"] == "32 -> 52" and larger["ended"] == "finished"
    epochs = printed_table(out, "Rows per epoch, counted per row id on the ranks")
    assert [(e["epoch"], e["seen"], e["twice"], e["skipped"]) for e in epochs] == [
        (str(epoch), "256", "0", "0") for epoch in range(3)
    ]
    assert epochs[1]["ranks"] == "2 -> 1 -> 2"
    assert (
        f"sizes [2, 1, 2]; 52 steps, 2 done again after the loss; rows twice 0, skipped 0; checkpoints in {ckpt}"
        in out
    )
    assert "[demo] taking executor" in out and "away for good" in out
    assert "[rank 0] attempt 2: 1 rank, epoch 1 from checkpoint 24" in out
    assert "attempt 1/3 failed: rank" in proc.stderr
    assert (
        "grow from 1 to 2 ranks: task slots became free (stopped after checkpoint step 32)"
        in proc.stderr
    )
    assert "returns no value" not in proc.stderr  # it does return one: the larger attempt's
    final = load_latest(str(ckpt))
    assert final is not None and final.step == 52 and int(final.state["rows"].sum()) == 3 * 256
    # Nothing the demo started outlives it: its JVMs, executors, tasks and ranks all had
    # its private TMPDIR in their environment.
    wait_for(lambda: not started_with(f"TMPDIR={private_tmp}"), 60, "the demo's processes gone")


@pytest.mark.spark
def test_resume_demo_elastic_refuses_an_active_session(spark, tmp_path, capsys):
    from sparktrain.examples import resume_demo

    with pytest.raises(SystemExit) as info:
        resume_demo.main(["--elastic", "--checkpoint-dir", str(tmp_path / "ckpt")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "this process has an active SparkSession (local-cluster[2,1,1024])" in err
    assert "run the demo in a process of its own" in err
    assert spark.sparkContext._jsc.sc().getExecutorIds().size() == 2  # its executors untouched
    assert not (tmp_path / "ckpt").exists()
