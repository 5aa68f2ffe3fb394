"""The house rules that tools can check: ruff (lint, import order, format) and mypy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["sparktrain", "tests", "benchmarks", "_sparktrain_horovod.py", "setup.py"]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -r requirements/test.txt)")
    return found


def run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_lint():
    result = run(tool("ruff"), "check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = run(tool("ruff"), "format", "--check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


# mypy on a fresh clone (no cache) needs about 55 s of CPU, a third of it reading torch's
# annotations; beside two other suites on two cores it gets a sixth of one and took over 300 s.
@pytest.mark.timeout(660)
def test_mypy():
    result = run(tool("mypy"), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_merge_conflict_markers():
    """A conflict left in any tracked file (code, README, notebook) fails here, not for a user."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    listed = run("git", "ls-files", "-z")
    assert listed.returncode == 0, listed.stderr
    found = []
    for name in filter(None, listed.stdout.split("\0")):
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(lines, 1):
            if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "=======":
                found.append(f"{name}:{number}: {line}")
    assert not found, "merge-conflict markers are committed:\n" + "\n".join(found)


def test_the_package_is_declared_in_pyproject_alone() -> None:
    """PEP 621: pyproject.toml has the build system, the metadata and the tools' settings."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    system = declared["build-system"]
    assert system["build-backend"] == "setuptools.build_meta"
    assert any(r.startswith("setuptools") for r in system["requires"])
    project = declared["project"]
    assert project["dynamic"] == ["version"]
    assert declared["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "sparktrain.__version__"
    }
    assert project["license-files"] == ["LICENSE"]
    assert {"pytest", "mypy", "ruff"} <= set(declared["tool"])
    assert not (ROOT / "setup.cfg").exists() and not (ROOT / "ruff.toml").exists()
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")


def test_the_test_tools_are_not_in_the_users_extras() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    offered = " ".join(" ".join(deps) for deps in extras.values())
    for tool_name in ("pytest", "mypy", "ruff", "moto", "nbclient"):
        assert tool_name not in offered
        assert tool_name in (ROOT / "requirements" / "test.txt").read_text()
    assert "test" not in extras
