"""What a newcomer gets from the package: the wheel built from this checkout, installed into a
fresh virtual environment with the extras the README names, then, from a folder outside the
checkout, the runnable blocks of the README and of the site's pages in order, and the tour
notebook.

Slow (a virtual environment and two Spark applications of its own), so one module fixture
builds and installs once for both tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

import sparktrain
from tests.readme_blocks import documents, runnable_script

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "sparktrain_tour.ipynb"
EXTRAS = "spark,data,examples"

# The first test pays for building the wheel and installing it with its pins into a fresh
# venv (each pip step has a deadline of its own below), then runs every README block: the
# suite's default limit per test (300 s) is for one test's work, not for a whole install.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _clean_env(python: Path) -> dict[str, str]:
    """The environment a newcomer's shell has: nothing of this checkout or its venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
        and not k.startswith(("SPARKTRAIN_", "PYTEST_"))
    }
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(python)  # executors start the environment's Python
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The interpreter of a fresh venv with the wheel of this checkout and its extras."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17+ is needed for Spark")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files the wheel is built from are unknown")
    work = tmp_path_factory.mktemp("newcomer")
    source = work / "source"  # the tracked files only: the build leaves nothing in the checkout
    listed = _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)])
    wheel = next(dist.glob("sparktrain-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "sparktrain/commands/install-horovod.sh" in names
    assert "sparktrain/py.typed" in names  # the type hints ship
    assert f"\nVersion: {sparktrain.__version__}\n" in metadata  # one version, the package's
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "<<<<<<<" not in metadata and ">>>>>>>" not in metadata  # the index page's text

    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    # As the README's Install says: the package alone, its pins, then torch and the rest with
    # them (torch from pip's configuration here, the CPU build, where the README names
    # PyTorch's CPU index).
    pip = [str(python), "-m", "pip", "install", "-q"]
    _run([*pip, "--no-deps", str(wheel), "cloudpickle"], timeout=600)
    printed = _run([str(venv / "bin" / "sparktrain"), "constraints"], cwd=work).stdout
    assert printed == (ROOT / "constraints.txt").read_text()  # the versions the suite runs with
    pins = work / "constraints.txt"
    pins.write_text(printed)
    _run([*pip, "-c", str(pins), "torch"], timeout=1200)
    _run([*pip, "-c", str(pins), f"{wheel}[{EXTRAS}]", "ipykernel"], timeout=1200)
    return python


def test_readme_blocks_run_as_written_from_the_installed_wheel(installed: Path, tmp_path: Path):
    script = tmp_path / "readme.py"
    script.write_text(runnable_script(documents(ROOT), ROOT), encoding="utf-8")
    outside = tmp_path / "somewhere-else"
    outside.mkdir()
    # The blocks make checkpoint folders with tempfile.mkdtemp() and keep them, as a user's
    # would: under a TMPDIR of their own, removed afterwards (short: it holds the ranks'
    # AF_UNIX sockets, whose paths are limited to 107 bytes).
    scratch = Path(tempfile.mkdtemp(prefix="st-readme-", dir="/tmp"))
    try:
        proc = subprocess.run(
            [str(installed), str(script)],
            cwd=outside,
            env={**_clean_env(installed), "TMPDIR": str(scratch)},
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-3000:]}\n{proc.stderr[-6000:]}"
    # Each block ran, in order, and printed what it says it prints.
    assert out.count("--- block at ") >= 8
    metrics = [line for line in out.splitlines() if line.startswith("{'loss': ")]
    assert len(metrics) == 2 and all("'world_size': 2}" in m for m in metrics), out
    assert [float(m.split()[1].rstrip(",")) < 0.5 for m in metrics] == [True, True], metrics
    lines = out.splitlines()
    # The submitted runs: the record of the first, then the sweep's two losses, in order.
    assert any(line.startswith("attempt 1 on 2 ranks: ok (") for line in lines), out
    sweep = [line for line in lines if line.startswith("losses by lr: [")]
    assert len(sweep) == 1 and sweep[0].count(",") == 1, out
    # The decorator: a plain call, every rank's value, and a remote run's handle awaited.
    assert "(0, 'here')" in lines and "[(0, 'there'), (1, 'there')]" in lines
    assert "[(0, 0.01), (1, 0.01)]" in lines
    assert "2" in lines and "500" in lines  # HorovodRunner's size; rank 0's shard of 1000
    history = next(x for x in lines if x.startswith("{'epoch': 14"))
    assert "'val_accuracy'" in history
    assert out.count("|prediction|") >= 2  # the scored and the reloaded pipeline
    warnings = [x for x in proc.stderr.splitlines() if "Warning:" in x]
    assert warnings == [], warnings


@pytest.fixture
def installed_kernel(installed: Path, tmp_path: Path, monkeypatch) -> str:
    """A ``python3`` kernel spec for the installed venv, under a temporary Jupyter path."""
    prefix = tmp_path / "jupyter-prefix"
    _run([str(installed), "-m", "ipykernel", "install", "--prefix", str(prefix)])
    kernel = prefix / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    assert json.loads(kernel.read_text())["argv"][0] == str(installed)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    for name, value in _clean_env(installed).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return "python3"


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_tour_notebook_runs_from_the_installed_wheel(installed_kernel: str, tmp_path: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    workdir = tmp_path / "run"
    workdir.mkdir()
    client = nbclient.NotebookClient(
        nb,
        kernel_name=installed_kernel,
        timeout=300,
        allow_errors=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"a notebook cell failed:\n{exc}")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "a code cell did not run"
    everything = "\n".join(_text(c) for c in code)
    assert "[rank 1]" in everything  # ranks' output streamed to the notebook
    assert "resuming after epoch 4" in everything
    assert "HorovodRunner returned {'ranks': 2" in everything  # built-in horovod.torch here
    assert "sparktrain's built-in implementation" in everything
    images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the plot cell shows no image"
    png = workdir / "sparktrain-tour" / "history.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # Nothing a user would have to wonder about: no warnings in any cell's output.
    noise = [
        line
        for c in code
        for o in c.get("outputs", [])
        for line in o.get("text", "").splitlines()
        if "Warning" in line
    ]
    assert noise == [], noise


def test_databricks_horovod_notebook_runs_from_the_installed_wheel(
    installed: Path, tmp_path: Path
) -> None:
    """Databricks' HorovodRunner MNIST notebook with its one import changed, in the installed
    environment (no Horovod there): its module-level ``import horovod.torch as hvd`` gets the
    stand-in that the wheel's sparktrain-horovod.pth installs."""
    script = ROOT / "tests" / "fixtures" / "scripts" / "hvd_notebook.py"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    proc = subprocess.run(
        [str(installed), str(script), "-2", str(checkpoints)],
        cwd=tmp_path,
        env=_clean_env(installed),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "[rank 0] Train Epoch: 1 [0/96 (0%)]" in out and "[rank 1] Train Epoch: 2" in out
    assert "[rank 0] sparktrain: horovod.torch here is sparktrain's built-in implementation" in out
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "checkpoint-1.pth.tar",
        "checkpoint-2.pth.tar",
    ]
    assert "driver: ConfigurationError: hvd.init() was called outside a Horovod rank" in out
