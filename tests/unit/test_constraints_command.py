"""``sparktrain constraints``: the pins shipped in the package, readable right after
``pip install --no-deps sparktrain cloudpickle`` (torch, psutil and pyspark not yet there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparktrain.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]

# Every later import of these fails, as in an environment where they are not installed yet.
BLOCK = """
import sys
for name in ("torch", "psutil", "pyspark", "numpy", "pandas", "pyarrow"):
    sys.modules[name] = None
from sparktrain.commands.cli import main
sys.exit(main(["constraints"]))
"""


def test_it_prints_the_checkouts_constraints(capsys) -> None:
    assert main(["constraints"]) == 0
    printed = capsys.readouterr().out
    assert printed == (ROOT / "constraints.txt").read_text()
    assert "\ntorch==2.13.0\n" in printed and "\ncloudpickle==" in printed


def test_it_needs_neither_torch_nor_pyspark(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "constraints.txt").read_text()


def test_the_wheel_ships_the_file() -> None:
    setup = (ROOT / "setup.cfg").read_text()
    assert "sparktrain = defaults.conf, py.typed, constraints.txt," in setup
    assert (ROOT / "constraints.txt").resolve() == ROOT / "sparktrain" / "constraints.txt"
