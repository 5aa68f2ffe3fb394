"""The checkpoint benchmark (benchmarks/bench_checkpoint.py) runs at a tiny size, so it cannot
rot: every method's row, every ratio, every load, and its temporary folder removed."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparktrain import checkpoint
from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_checkpoint.py"


def bench_module() -> Any:
    return helpers.bench_module("bench_checkpoint")


def test_every_size_loads_what_it_and_every_other_size_saved() -> None:
    assert bench_module().plan([4, 2]) == [(4, True, [4]), (2, True, [2, 4]), (4, False, [2])]
    plan = bench_module().plan([4, 2, 3])
    assert [(ranks, save) for ranks, save, _ in plan] == [
        (4, True),
        (2, True),
        (3, True),
        (4, False),
        (2, False),
    ]
    loads = {(ranks, saved) for ranks, _, sizes in plan for saved in sizes}
    assert loads == {(a, b) for a in (4, 2, 3) for b in (4, 2, 3)}
    # A size loads only what was saved before its run.
    done: set[int] = set()
    for ranks, save, sizes in plan:
        done |= {ranks} if save else set()
        assert set(sizes) <= done


def test_rows_divide_among_every_size() -> None:
    rows, cols = bench_module().layout(1024, 16, [4, 3, 2])
    assert rows % 12 == 0
    assert rows * cols * 4 * 16 == pytest.approx(1 << 30, rel=0.01)


# Three runs of 1-2 ranks (each imports torch), 8 MiB saved 2 times by each method: ~15 s.
@pytest.mark.timeout(120)
def test_quick_run_prints_every_row_and_leaves_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dir", str(work)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # (c) is measured exactly where save() takes asynchronous=, found the benchmark's way.
    has_async = "asynchronous" in inspect.signature(checkpoint.save).parameters
    for ranks in (2, 1):
        for method in ("(a) whole save", "(b) sharded=True", "(d) DCP async_save by hand"):
            assert f"| {ranks} | {method} | " in out, out
        row_c = f"| {ranks} | (c) sharded, asynchronous | "
        assert row_c in out, out
        assert (f"{row_c}not available" in out) is not has_async, out
        assert (f"| {ranks} | (c)/(a) blocking | " in out) is has_async, out
        assert f"| {ranks} | (b)/(a) blocking | " in out, out
        for saved in (2, 1):
            assert f"\n| {ranks} | {saved} | " in out, out  # the load at each size
    assert "REFUSED" not in proc.stderr
    assert list(work.iterdir()) == []  # its temporary folder is gone
