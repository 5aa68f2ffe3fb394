"""Databricks' HorovodRunner MNIST notebook (tests/fixtures/scripts/hvd_notebook.py) runs with
one import changed: on the driver without Horovod (the stand-in that sparktrain-horovod.pth
installs answers the notebook's module-level ``import horovod.torch as hvd``), and on Spark
executors, where ``hvd`` inside ``train_hvd`` is the ranks' own horovod.torch."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from sparktrain import HorovodRunner

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "hvd_notebook.py"
PTH = ROOT / "sparktrain-horovod.pth"
BUILTIN = "sparktrain: horovod.torch here is sparktrain's built-in implementation"


def site_without_horovod(folder: Path) -> Path:
    """A site folder holding everything of this environment's site-packages but Horovod
    (links), and the ``.pth`` file the wheel installs: an environment without Horovod."""
    packages = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for entry in packages.iterdir():
        name = entry.name.lower()
        if name == "horovod" or name.startswith("horovod-") or entry.name == PTH.name:
            continue
        (folder / entry.name).symlink_to(entry)
    (folder / PTH.name).write_text(PTH.read_text())
    return folder


def run_without_horovod(
    site: Path, code: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that sees ``site`` and not this environment's own."""
    prelude = f"import site, sys; site.addsitedir({str(site)!r}); sys.argv[1:] = {list(args)!r}\n"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-S", "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=site.parent,
        env={**environ, **env},
    )


@pytest.fixture(scope="module")
def no_horovod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return site_without_horovod(tmp_path_factory.mktemp("env") / "site")


def test_the_notebook_runs_on_a_driver_without_horovod(no_horovod: Path, tmp_path: Path) -> None:
    """np=-2: the notebook's module-level import works on the driver, the ranks get the
    built-in horovod.torch, their output streams by default, rank 0 writes the checkpoints,
    and Horovod called on the driver itself says where it runs."""
    code = f"import runpy; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    proc = run_without_horovod(no_horovod, code, "-2", str(tmp_path))
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-3000:]}\n{proc.stderr[-3000:]}"
    # HorovodRunner's default shows the ranks' lines, as Databricks' does.
    assert "[rank 0] Train Epoch: 1 [0/96 (0%)]" in out and "[rank 1] Train Epoch: 2" in out
    assert f"[rank 0] {BUILTIN}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-1.pth.tar",
        "checkpoint-2.pth.tar",
    ]
    driver = [line for line in out.splitlines() if line.startswith("driver: ")]
    assert driver == [
        "driver: ConfigurationError: hvd.init() was called outside a Horovod rank: Horovod is "
        "not installed here, and horovod.torch is sparktrain's stand-in, which only names "
        "Horovod's API. Call it inside the function you give to HorovodRunner(np=...).run(fn) "
        "(or SparkRunner(backend='horovod')): there every rank has a working horovod.torch"
    ]


def test_the_stand_in_is_only_a_stand_in(no_horovod: Path) -> None:
    """What the driver's horovod.torch is: Horovod's names, sparktrain's constants, not an
    installed Horovod to sparktrain's checks, and gone with SPARKTRAIN_HOROVOD_STANDIN=0."""
    code = (
        "import importlib.util, horovod.torch as hvd\n"
        "from sparktrain.backends.horovod_install import installed_horovod\n"
        "from sparktrain.hvdcompat import api\n"
        "print(hvd.Average is api.Average, hvd.Compression.fp16 is api.Compression.fp16)\n"
        "print(importlib.util.find_spec('horovod') is not None, installed_horovod())\n"
        "print(sorted(set(api.__all__) - set(dir(hvd))))\n"
        "print(hvd.elastic.run.__module__)\n"
        "try:\n    hvd.allreduce\n    hvd.mpi_lib_v2\nexcept NotImplementedError as e:\n"
        "    print('missing:', e)\n"
    )
    proc = run_without_horovod(no_horovod, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[:3] == ["True True", "True None", "[]"]
    # Horovod's elastic API is there on the driver too (a notebook decorates with it).
    assert proc.stdout.splitlines()[3].startswith("sparktrain.hvdcompat.elastic")
    assert "missing: hvd.mpi_lib_v2 is not supported" in proc.stdout
    off = run_without_horovod(no_horovod, "import horovod.torch", SPARKTRAIN_HOROVOD_STANDIN="0")
    assert off.returncode == 1
    assert "ModuleNotFoundError: No module named 'horovod'" in off.stderr


def _notebook(log_dir: Path) -> dict[str, Any]:
    """The notebook's globals, as a notebook kernel holds them after its cells ran."""
    cells = runpy.run_path(str(SCRIPT), run_name="hvd_notebook")
    # run_path returns a copy: the functions' own globals are where a later cell's value goes.
    cells["train_hvd"].__globals__["hvd_log_dir"] = str(log_dir)
    return cells


@pytest.mark.horovod
def test_the_notebook_on_spark_executors(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """np=2 on executors: ``hvd`` in train_hvd travels by its module's name and is the ranks'
    built-in horovod.torch (horovod_impl='builtin', whatever the driver has)."""
    cells = _notebook(tmp_path)
    hr = HorovodRunner(np=2, horovod_impl="builtin")
    assert hr.run(cells["train_hvd"], learning_rate=0.001) is None
    out = capsys.readouterr().out
    assert f"[rank 0] {BUILTIN}" in out
    assert "[rank 0] Train Epoch: 2 [0/96 (0%)]" in out and "[rank 1] Train Epoch: 2" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-1.pth.tar",
        "checkpoint-2.pth.tar",
    ]
