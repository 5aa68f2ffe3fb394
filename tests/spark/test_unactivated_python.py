"""From a virtual environment that is not activated (an IDE, a Jupyter kernel, cron), every
Spark job sparktrain starts runs the executors' Python a run chooses, not ``python3`` on PATH.

One subprocess: this venv's interpreter run directly, with no PYSPARK_PYTHON and a PATH whose
first ``python3`` is a fresh venv's (the same Python, without pyarrow, torch or sparktrain),
runs ``tests/fixtures/unactivated_jobs.py`` on a ``local-cluster`` session of its own (and
``sparktrain doctor --spark``'s ``local[2]`` one). Before every job pinned the interpreter,
all but doctor's Spark check failed there, with ``No module named 'pyarrow'`` (or
``'cloudpickle'``) from the PATH's ``python3``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "unactivated_jobs.py"
JOBS = (
    "converter",
    "converter tasks",
    "estimator",
    "from_dataframe",
    "predict_udf",
    "doctor cluster",
    "doctor spark",
)
UNSET = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")


@pytest.fixture(scope="module")
def bare_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a fresh venv: a ``python3`` that cannot import pyarrow."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bare = venv / "bin"
    found = subprocess.run([bare / "python3", "-c", "import pyarrow"], capture_output=True)
    assert found.returncode != 0, "the bare venv's python3 imports pyarrow"
    return bare


def _unactivated_env(bare: Path) -> dict[str, str]:
    """This environment as an un-activated venv's: nothing names the executors' Python, and
    ``python3`` on PATH is ``bare``'s."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    ours = os.path.dirname(sys.executable)
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    env["PATH"] = os.pathsep.join([str(bare), *rest])
    return env


@pytest.mark.slow
# Its own local-cluster session and doctor's local[2] one side by side, then tiny jobs: about
# 1.5 min on a quiet 2-core machine, several times that on a busy one.
@pytest.mark.timeout(480)
def test_every_spark_job_runs_the_runs_python_from_an_unactivated_venv(
    bare_bin: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), (tmp_path / "cache").as_uri()],
        env=_unactivated_env(bare_bin),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=450,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(("OK ", "FAIL "))]
    report = "\n".join(lines) + "\n--- stderr (end) ---\n" + done.stderr[-4000:]
    assert done.returncode == 0, report
    outcomes = {line.split(" ", 1)[1].split(":", 1)[0]: line for line in lines}
    assert sorted(outcomes) == sorted(JOBS), report
    failed = [line for line in lines if line.startswith("FAIL ")]
    assert failed == [], report
    assert outcomes["converter"] == "OK converter: 8 rows loaded"
    assert outcomes["converter tasks"] == "OK converter tasks: 8 rows loaded"
    assert outcomes["estimator"] == "OK estimator: fit, and 8 rows transformed"
    assert outcomes["from_dataframe"] == "OK from_dataframe: 8 rows streamed to 2 ranks"
    assert outcomes["predict_udf"] == "OK predict_udf: 8 rows predicted"
