"""scripts/hvd-suite.py's own logic: which tests it finds in Horovod's suite, and how it sums
each rank's outcome into one per test."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def suite() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hvd_suite", ROOT / "scripts" / "hvd-suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_finds_the_test_methods_of_torch_tests_in_file_order(
    suite: ModuleType, tmp_path: Path
) -> None:
    planted = tmp_path / "test_torch.py"
    planted.write_text(
        "import horovod.torch as hvd\n"  # never imported: read as text
        "def test_outside(): pass\n"
        "class TorchTests:\n"
        "    def setUp(self): pass\n"
        "    def test_b(self): pass\n"
        "    def helper(self): pass\n"
        "    def test_a(self): pass\n"
    )
    assert suite.test_names(planted) == ["test_b", "test_a"]
    other = tmp_path / "other.py"
    other.write_text("class SomethingElse:\n    def test_x(self): pass\n")
    with pytest.raises(SystemExit, match="has no class TorchTests"):
        suite.test_names(other)


def test_one_failing_rank_fails_the_test_and_a_missing_outcome_takes_how_the_launch_ended(
    suite: ModuleType,
) -> None:
    names = ["ok", "one_fails", "gpu_only", "mixed_skip", "unfinished"]
    per_rank = [
        {"ok": "pass", "one_fails": "pass", "gpu_only": "skip", "mixed_skip": "pass"},
        {"ok": "pass", "one_fails": "FAIL", "gpu_only": "skip", "mixed_skip": "skip"},
    ]
    assert suite.combine(names, per_rank, "HANG") == {
        "ok": "pass",
        "one_fails": "FAIL",
        "gpu_only": "skip",
        "mixed_skip": "pass",
        "unfinished": "HANG",
    }
    # A launch that ended normally without a rank's outcome: that rank died.
    assert suite.combine(["unfinished"], per_rank, "done") == {"unfinished": "CRASH"}
