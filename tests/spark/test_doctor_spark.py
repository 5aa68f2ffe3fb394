"""``sparktrain doctor --spark``: the executors' Python is checked the way a run checks it."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from sparktrain.commands import doctor

pytestmark = pytest.mark.spark


def _rows(text: str) -> dict[str, tuple[str, str]]:
    table = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0] in ("✓", "✗", "!", "-"):
            name, _, detail = parts[1].partition("  ")
            table.setdefault(name.strip(), (parts[0], detail.strip()))
    return table


def _doctor() -> tuple[str, list[str]]:
    """``sparktrain doctor --spark``'s table, and the names of the failed essential rows.

    (``doctor.main`` would also check the session of this test process, host by host.)
    """
    checks = doctor.run_checks(spark=True)
    out = io.StringIO()
    doctor.render(checks, out)
    return out.getvalue(), doctor.missing_essentials(checks)


def test_doctor_spark_fails_an_executor_python_without_sparktrain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bare = str(venv / "bin" / "python")
    monkeypatch.setenv("PYSPARK_PYTHON", bare)
    text, broken = _doctor()
    table = _rows(text)
    assert broken == ["spark python"], text
    mark, detail = table["spark python"]
    assert mark == "✗", text
    assert detail.startswith(
        f"the executors' Python cannot run sparktrain: {bare} (from PYSPARK_PYTHON)"
    )
    # Run from a checkout, sparktrain's own folder may be found, and its imports fail instead.
    assert "which cannot import sparktrain (ModuleNotFoundError: No module named '" in detail
    assert "torch (ModuleNotFoundError: No module named 'torch')" in detail
    assert (
        "fix: set PYSPARK_PYTHON (before the SparkSession starts) or spark.pyspark.python" in text
    )
    assert table["spark session"][0] == "-"  # no barrier stage with a Python that cannot run it
    assert "missing essentials: spark python" in text


def test_doctor_spark_passes_the_drivers_interpreter_on_a_local_master(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    text, broken = _doctor()
    table = _rows(text)
    mark, detail = table["spark python"]
    assert mark == "✓", text
    import torch

    import sparktrain

    assert detail == (
        f"executors run {sys.executable} (from the driver's interpreter (local master, "
        f"PYSPARK_PYTHON unset)): sparktrain {sparktrain.__version__}, torch {torch.__version__}"
    )
    assert table["spark session"][0] == "✓"
    assert "local[2] ran a 2-task barrier stage" in table["spark session"][1]
    assert "spark python" not in broken and "spark session" not in broken
