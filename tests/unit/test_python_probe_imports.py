"""The executors' Python check imports what a task and its ranks import first, not the lazy
``import sparktrain`` alone: a checkout's folder found on the path passes that in any Python."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparktrain.commands import doctor_probes
from sparktrain.shipping import python_probe

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with nothing installed, that finds the checkout's sparktrain folder."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


def _probe_in(python: str) -> dict:
    """The executor probe's report, run in ``python`` from the checkout as Spark would run it."""
    source = textwrap.dedent(inspect.getsource(python_probe._probe_task))
    code = f"from __future__ import annotations\nENTRY_MODULES = {python_probe.ENTRY_MODULES!r}\n"
    code += f"{source}\nimport json\n"
    code += "print(json.dumps(_probe_task(iter([0]))))"
    done = subprocess.run(
        [python, "-c", code], cwd=CHECKOUT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (found,) = json.loads(done.stdout.splitlines()[-1])
    return found


def test_import_sparktrain_alone_passes_there(bare_python: str) -> None:
    # Why the check must go further: this is what it saw before.
    done = subprocess.run(
        [bare_python, "-c", "import sparktrain"], cwd=CHECKOUT, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_executor_probe_reports_sparktrains_missing_dependency(bare_python: str) -> None:
    found = _probe_in(bare_python)
    assert found["found"] == bare_python
    assert found["modules"] == {}
    assert found["errors"]["sparktrain"].startswith("ModuleNotFoundError: No module named '")
    assert found["errors"]["torch"] == "ModuleNotFoundError: No module named 'torch'"


def test_the_same_probe_passes_the_drivers_python() -> None:
    found = _probe_in(sys.executable)
    assert found["errors"] == {}
    assert set(found["modules"]) == {"sparktrain", "torch"}


def test_doctor_fails_an_executor_python_that_cannot_run_sparktrain(
    bare_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(CHECKOUT)
    monkeypatch.setenv("PYSPARK_PYTHON", bare_python)
    checks = doctor_probes.check_pyspark(doctor_probes.installed_pyspark_version())
    (row,) = [c for c in checks if c.name == "executor python"]
    assert row.status == doctor_probes.FAIL, row
    assert f"PYSPARK_PYTHON={bare_python} cannot import sparktrain: ModuleNotFoundError" in (
        row.detail
    )
