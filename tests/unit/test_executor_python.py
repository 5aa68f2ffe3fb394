"""Which Python sparktrain's jobs start on the executors, from the application's settings."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from sparktrain.shipping.python_probe import (
    PYSPARK_DEFAULT,
    ProbeReport,
    check_executor_python,
    describe_failure,
    executor_python,
    is_local_master,
)


class FakeContext:
    """The world a SparkContext shows: its master, its settings, the interpreter PySpark read."""

    def __init__(self, master: str, python: str = PYSPARK_DEFAULT, **conf: str) -> None:
        self.master = master
        self.pythonExec = python
        self.conf = {key.replace("_", "."): value for key, value in conf.items()}

    def getConf(self) -> Any:  # noqa: N802 - SparkContext's name
        return self.conf


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[4,3]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://10.0.0.1:7077", False),
        ("yarn", False),
        ("k8s://https://api:6443", False),
        ("localhost", False),
    ],
)
def test_local_masters(master: str, local: bool) -> None:
    assert is_local_master(master) is local


def test_a_local_master_without_settings_runs_the_drivers_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    python, source = executor_python(FakeContext("local-cluster[2,1,1024]"))
    assert python == sys.executable
    assert source.startswith("the driver's interpreter")


def test_a_cluster_without_settings_keeps_pysparks_default(monkeypatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert executor_python(FakeContext("yarn")) == (
        "python3",
        "PySpark's default (PYSPARK_PYTHON unset: python3 from the executors' PATH)",
    )


def test_pyspark_python_is_kept_on_a_local_master(monkeypatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/env/bin/python")
    sc = FakeContext("local[2]", python="/opt/env/bin/python")
    assert executor_python(sc) == ("/opt/env/bin/python", "PYSPARK_PYTHON")


def test_the_setting_wins_over_the_environment(monkeypatch) -> None:
    """Spark documents spark.pyspark.python as taking precedence over PYSPARK_PYTHON."""
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/env/bin/python")
    sc = FakeContext(
        "yarn", python="/opt/env/bin/python", spark_pyspark_python="/opt/conda/bin/python"
    )
    assert executor_python(sc) == ("/opt/conda/bin/python", "spark.pyspark.python")


def test_this_interpreter_on_a_local_master_is_not_probed(monkeypatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    sc = FakeContext("local[2]")
    sc.parallelize = None  # a probe would need it: none runs
    assert check_executor_python(sc) is None


def test_the_message_for_a_python_without_sparktrain() -> None:
    report = ProbeReport(
        python="python3",
        found="/usr/bin/python3",
        host="worker-7",
        version="3.11.2",
        modules={"torch": "2.13.0"},
        errors={"sparktrain": "ModuleNotFoundError: No module named 'sparktrain'"},
    )
    assert not report.ok
    message = describe_failure(report, "PYSPARK_PYTHON")
    assert message == (
        "the executors' Python cannot run sparktrain: python3 (from PYSPARK_PYTHON); on "
        "worker-7 it started /usr/bin/python3 (Python 3.11.2), which cannot import sparktrain "
        "(ModuleNotFoundError: No module named 'sparktrain'). Set PYSPARK_PYTHON (before the "
        "SparkSession starts) or spark.pyspark.python to an interpreter that has sparktrain "
        f"and torch on every executor (this driver runs {sys.executable}), or install them "
        "into the executors' Python"
    )


def test_a_report_with_both_modules_is_ok() -> None:
    report = ProbeReport("python3", modules={"sparktrain": "0.1.0", "torch": "2.13.0"})
    assert report.ok
    assert not ProbeReport("python3", failure="Cannot run program").ok
