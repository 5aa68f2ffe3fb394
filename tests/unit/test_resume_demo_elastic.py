"""resume_demo --elastic without Spark: what it refuses before anything starts, and its tables.

The run itself (a local-cluster of its own losing an executor and getting it back) is in
tests/spark/test_restarts.py.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from sparktrain.driver.run_record import AttemptRecord, RunRecord
from sparktrain.examples import _elastic_cluster, _elastic_demo, resume_demo


def plant_spark_home(root: Path, *, submit: bool, core_jar: bool) -> Path:
    """A SPARK_HOME folder with, as asked, bin/spark-submit and jars/spark-core_2.13-4.3.0.jar."""
    (root / "bin").mkdir(parents=True)
    (root / "jars").mkdir()
    if submit:
        script = root / "bin" / "spark-submit"
        script.write_text("#!/bin/sh\nexit 1\n")
        script.chmod(0o755)
    if core_jar:
        (root / "jars" / "spark-core_2.13-4.3.0.jar").write_bytes(b"PK\x05\x06" + bytes(18))
    return root


def elastic_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        resume_demo.main(["--elastic", *argv])
    assert info.value.code == 2
    return capsys.readouterr().err


needs_java = pytest.mark.skipif(
    shutil.which("java") is None, reason="no java on PATH (Spark needs Java 17+)"
)


@needs_java
def test_a_pyspark_without_its_jars_is_refused_before_spark_starts(tmp_path, monkeypatch, capsys):
    home = plant_spark_home(tmp_path / "spark", submit=True, core_jar=False)
    monkeypatch.setenv("SPARK_HOME", str(home))
    ckpt = tmp_path / "ckpt"
    err = elastic_error(["--checkpoint-dir", str(ckpt)], capsys)
    assert f"SPARK_HOME ({home}) has no jars/spark-core_*.jar" in err
    assert "install the full package (pip install pyspark)" in err
    assert "the other modes (--np -2) need no Spark" in err
    assert not ckpt.exists()  # nothing was started or written


@needs_java
def test_a_spark_home_without_spark_submit_is_refused(tmp_path, monkeypatch):
    home = plant_spark_home(tmp_path / "spark", submit=False, core_jar=True)
    monkeypatch.setenv("SPARK_HOME", str(home))
    with pytest.raises(_elastic_cluster.ConfigurationError) as info:
        _elastic_cluster.check_local_cluster()
    assert f"({home}) has no bin/spark-submit (" in str(info.value)
    assert "set SPARK_HOME to a Spark distribution" in str(info.value)


def test_no_java_is_refused_naming_java_home(tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv(
        "SPARK_HOME", str(plant_spark_home(tmp_path / "s", submit=True, core_jar=True))
    )
    problem = _elastic_cluster.local_cluster_problem()
    assert problem is not None and "needs Java 17 or newer, and no 'java' was found" in problem
    assert "or set JAVA_HOME" in problem


@needs_java
@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="pyspark not installed")
def test_the_installed_pyspark_can_start_a_local_cluster(monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    package = Path(importlib.util.find_spec("pyspark").origin).parent  # not imported: fast
    assert _elastic_cluster.spark_home() == package
    assert (package / "jars").is_dir()
    assert _elastic_cluster.local_cluster_problem() is None


def test_options_the_elastic_mode_does_not_take_are_refused(tmp_path, capsys):
    assert "leave --np out" in elastic_error(["--np", "2"], capsys)
    assert "leave --steps-per-epoch out" in elastic_error(["--steps-per-epoch", "5"], capsys)
    assert "--epochs must be 2 or more" in elastic_error(["--epochs", "1"], capsys)
    assert "--away must be a number of seconds >= 0; got nan" in elastic_error(
        ["--away", "nan"], capsys
    )
    used = tmp_path / "used"
    used.mkdir()
    (used / "sparktrain-owner.json").write_text("{}")
    err = elastic_error(["--checkpoint-dir", str(used)], capsys)
    assert f"--checkpoint-dir {used} holds files" in err and "new or empty folder" in err
    assert [p.name for p in used.iterdir()] == ["sparktrain-owner.json"]


def report(attempt: int, size: int, step: int, epoch: int, **flags: int) -> dict:
    metrics = {
        "attempt": float(attempt),
        "size": float(size),
        **{k: float(v) for k, v in flags.items()},
    }
    return {"type": "report", "rank": 0, "step": step, "epoch": epoch, "metrics": metrics}


def test_the_tables_count_steps_done_again_and_each_epochs_sizes(capsys):
    # The story of the demo as rank 0 reports it: 2 ranks (16 steps an epoch) lose a host at
    # step 26, two steps after checkpoint 24; 1 rank goes on from 24 to checkpoint 32 and is
    # stopped there to grow; 2 ranks finish epochs 1 and 2 at step 52.
    record = RunRecord(elastic=(1, 2))
    cause = "rank 1 on 10.0.0.2 was lost: its Spark task vanished (executor lost)"
    lost = AttemptRecord(attempt=0, world_size=2, error=RuntimeError(cause), cause=cause)
    grown = AttemptRecord(attempt=1, world_size=1, error=RuntimeError("grow"), resized=True)
    record.attempts = [lost, grown, AttemptRecord(attempt=2, world_size=2)]
    record.reports = [report(0, 2, 0, 0, start=1)]
    record.reports += [report(0, 2, s, 0 if s <= 16 else 1) for s in range(1, 27)]
    record.reports += [report(0, 2, 26, 1, holding=1), report(1, 1, 24, 1, start=1)]
    record.reports += [report(1, 1, s, 1) for s in range(25, 33)]
    record.reports += [report(2, 2, 32, 1, start=1)]
    record.reports += [report(2, 2, s, 1 if s <= 36 else 2) for s in range(33, 53)]
    once = [{"epoch": e, "rows": 256, "seen": 256, "twice": 0, "skipped": 0} for e in range(3)]
    result = {"steps": 52, "epochs": once}

    summary = _elastic_demo.summarize(record, result, "/ckpt")

    assert summary["sizes"] == [2, 1, 2]
    assert [(a["steps"], a["again"]) for a in summary["attempts"]] == [
        ("0 -> 26", 2),
        ("24 -> 32", 0),
        ("32 -> 52", 0),
    ]
    assert [a["ended"] for a in summary["attempts"]] == [
        "rank 1 on 10.0.0.2 was lost; back to checkpoint 24",
        "stopped to grow after checkpoint 32",
        "finished",
    ]
    assert [e["sizes"] for e in summary["epochs"]] == ["2", "2 -> 1 -> 2", "2"]
    out = capsys.readouterr().out
    assert "sizes [2, 1, 2]; 52 steps, 2 done again after the loss; rows twice 0, skipped 0" in out
    assert "Rows per epoch, counted per row id on the ranks" in out


class StuckRun:
    """A run whose rank 0 never reports holding: what the operator follows, and its cancel."""

    def __init__(self) -> None:
        self.record = RunRecord(reports=[report(0, 2, 1, 0, start=1)])
        self.cancels: list[float | None] = []

    def done(self) -> bool:
        return bool(self.cancels)

    def cancel(self, wait: float | None = None) -> bool:
        self.cancels.append(wait)
        return True


def test_the_operator_gives_up_on_a_run_that_never_reaches_the_host_loss():
    class Session:
        sparkContext = None  # never reached: nothing is taken away

    run = StuckRun()
    operator = _elastic_cluster.Operator(Session(), "/nonexistent", away=3.0, limit=0.3)
    operator.start(run)
    operator._thread.join(30)
    assert not operator._thread.is_alive()
    assert isinstance(operator.error, _elastic_cluster.RunTimeoutError)
    assert str(operator.error) == (
        "the demo waited 0.3 s for the first attempt to reach the middle of epoch 1"
    )
    assert run.cancels == [0]  # the run is stopped, and the error raised on the driver
