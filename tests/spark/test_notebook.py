"""notebooks/sparktrain_tour.ipynb runs top to bottom without an error.

The notebook starts its own SparkSession, so it runs in a separate kernel process: a
``python3`` kernel spec written into a temporary Jupyter path, pointing at this interpreter
(the venv's), so the kernel sees the same packages whatever kernels the machine has."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "sparktrain_tour.ipynb"

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch) -> str:
    """Install a ``python3`` kernel spec for this interpreter under a temporary prefix."""
    kernelspec = pytest.importorskip("ipykernel.kernelspec")
    prefix = tmp_path / "jupyter-prefix"
    kernelspec.install(kernel_name="python3", prefix=str(prefix))
    kernel_json = prefix / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    assert sys.executable in kernel_json.read_text()
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    return "python3"


def test_tour_notebook_runs(venv_kernel, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if shutil.which("java") is None:
        pytest.skip("Java 17+ is needed for the notebook's SparkSession")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(venv_kernel)
    assert spec.argv[0] == sys.executable, spec.argv

    nb = nbformat.read(NOTEBOOK, as_version=4)
    workdir = tmp_path / "run"
    workdir.mkdir()
    client = nbclient.NotebookClient(
        nb,
        kernel_name=venv_kernel,
        timeout=240,
        allow_errors=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"a notebook cell failed:\n{exc}")

    def text(cell) -> str:
        parts = []
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
        return "".join(parts)

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "a code cell did not run"
    everything = "\n".join(text(c) for c in code)
    assert "[rank 1]" in everything  # ranks' output streamed to the notebook
    assert "resuming after epoch 2" in everything
    images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the plot cell shows no image"
    png = workdir / "sparktrain-tour" / "history.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
