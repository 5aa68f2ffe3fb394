"""The executors' Python: a run whose executors start an interpreter without sparktrain is
refused before its barrier stage, with one error that says what to set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.errors import ConfigurationError
from sparktrain.shipping.python_probe import (
    check_executor_python,
    executor_python,
    pin_python,
    probe,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a fresh virtual environment: this Python, without sparktrain or
    torch (what ``python3`` from PATH is for a user whose sparktrain lives in a venv)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


def _conf_with(spark: Any, python: str) -> Any:
    """The application's settings, with spark.pyspark.python naming ``python``."""
    conf = spark.sparkContext.getConf()
    conf.set("spark.pyspark.python", python)
    return conf


def _jobs_since(sc: Any, marker: int) -> list[list[int]]:
    """For each job after job ``marker``: the number of tasks of each of its stages."""
    tracker = sc.statusTracker()
    jobs = []
    for job_id in range(marker + 1, marker + 50):
        info = tracker.getJobInfo(job_id)
        if info is None:
            continue
        stages = [tracker.getStageInfo(s) for s in info.stageIds]
        jobs.append([s.numTasks for s in stages if s is not None])
    return jobs


def _last_job(sc: Any) -> int:
    """The id of a job run now, so that the jobs after it can be told apart."""
    group = "sparktrain-test-marker"
    sc.setJobGroup(group, "marker")
    try:
        sc.parallelize([0], 1).count()
        return max(sc.statusTracker().getJobIdsForGroup(group))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


def test_a_run_whose_executors_lack_sparktrain_fails_before_its_barrier_stage(
    spark: Any, bare_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = spark.sparkContext
    conf = _conf_with(spark, bare_python)
    monkeypatch.setattr(sc, "getConf", lambda: conf)
    marker = _last_job(sc)
    runner = SparkRunner(np=2, progress=False)
    with pytest.raises(ConfigurationError) as info:
        runner.run(sum, [1, 2])
    message = str(info.value)
    assert message.startswith(
        f"the executors' Python cannot run sparktrain: {bare_python} (from spark.pyspark.python)"
    )
    assert f"it started {bare_python} (Python {sys.version.split()[0]})" in message
    assert "cannot import sparktrain (ModuleNotFoundError: No module named 'sparktrain')" in message
    assert "Set PYSPARK_PYTHON (before the SparkSession starts) or spark.pyspark.python" in message
    assert sys.executable in message  # the driver's interpreter, which has both
    assert "\tat " not in message and "py4j" not in message  # no Java trace
    # One job of one task ran (the probe); no barrier stage of np=2 tasks was submitted.
    assert _jobs_since(sc, marker) == [[1]]
    assert runner.last_run is None


def test_the_probe_reports_what_the_executor_imported(spark: Any) -> None:
    python = sys.executable
    report = probe(spark.sparkContext, python, timeout=120)
    assert report is not None and report.ok
    assert report.found == python
    assert set(report.modules) == {"sparktrain", "torch"}
    import torch

    assert report.modules["torch"] == torch.__version__
    # Cached per context and interpreter: asked again, no job runs.
    marker = _last_job(spark.sparkContext)
    assert probe(spark.sparkContext, python) is report
    assert _jobs_since(spark.sparkContext, marker) == []


def test_an_interpreter_that_does_not_exist_is_one_clear_error(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "no-such-python")
    conf = _conf_with(spark, missing)
    monkeypatch.setattr(spark.sparkContext, "getConf", lambda: conf)
    with pytest.raises(ConfigurationError) as info:
        check_executor_python(spark.sparkContext, timeout=120)
    message = str(info.value)
    assert message.startswith(f"the executors' Python cannot run sparktrain: {missing}")
    assert "Spark could not run a Python task with it" in message
    assert "Cannot run program" in message or "No such file" in message
    assert len(message.splitlines()) == 1


def test_the_sessions_own_interpreter_on_a_local_master_is_not_probed(spark: Any) -> None:
    """The fixture's executors run this interpreter on this machine: known to work."""
    assert executor_python(spark.sparkContext) == (sys.executable, "spark.pyspark.python")
    marker = _last_job(spark.sparkContext)
    assert check_executor_python(spark.sparkContext) is None
    assert _jobs_since(spark.sparkContext, marker) == []


def test_pin_python_sets_the_interpreter_of_one_rdd_alone(spark: Any, bare_python: str) -> None:
    sc = spark.sparkContext
    before = sc.pythonExec
    pinned = sc.parallelize([0], 1).map(lambda _: sys.executable)
    pin_python(pinned, sc, bare_python)
    other = sc.parallelize([0], 1).map(lambda _: sys.executable)
    assert sc.pythonExec == before
    assert pinned.collect() == [bare_python]
    assert other.collect() == [before]
