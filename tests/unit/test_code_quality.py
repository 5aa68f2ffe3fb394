"""The house rules that tools can check: ruff (lint, import order, format) and mypy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["sparktrain", "tests", "benchmarks"]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint():
    result = run(tool("ruff"), "check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = run(tool("ruff"), "format", "--check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
    result = run(tool("mypy"))
    assert result.returncode == 0, result.stdout + result.stderr
