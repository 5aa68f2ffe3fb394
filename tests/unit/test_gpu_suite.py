"""The GPU suite (benchmarks/gpu_suite.py) runs every case's code path on the CPU.

The dry run is the suite's one command with tiny sizes, CPU tensors and gloo: these tests run
it and read what a person reads, results.json and results.md. No figure is judged (the dry
run's numbers mean nothing); that every row has its figures or says why not, and that each
ratio is made of its row's two figures, is.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"
CASES = (
    "seeds.databricks", "seeds.alcf", "first_step", "loader", "inference", "checkpoint",
    "mixed_precision",
)  # fmt: skip


def report_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gpu_report", ROOT / "benchmarks" / "gpu_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run(tmp_path: Path, *options: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "results"
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the suite's scratch folder goes there
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--dry-run", "--out", str(out), *options],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), (out / "results.md").read_text()


# The whole suite on the CPU: seven cases, fifteen processes that import torch (ranks, two of
# them per np=-k call, a zygote, plain processes), about 30 s of CPU; beside other suites on
# two cores, minutes.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dry_run_gives_every_case_its_rows(tmp_path: Path) -> None:
    results, table = dry_run(tmp_path)

    assert results["dry_run"] is True
    assert [(name, case["status"]) for name, case in results["cases"].items()] == [
        (name, "ok") for name in CASES
    ], {name: case.get("error") for name, case in results["cases"].items()}
    rows = results["rows"]
    assert {row["case"] for row in rows} == set(CASES)
    for row in rows:
        if row["skip"]:
            assert row["sparktrain"] is None and row["ratio"] is None and row["met"] is None
            continue
        ours, peer = row["sparktrain"], row["peer"]
        assert math.isfinite(ours) and math.isfinite(peer) and peer > 0, row
        assert row["ratio"] == pytest.approx(ours / peer), row
        assert row["peer_name"], row
        if row["target"] is not None:
            assert isinstance(row["met"], bool), row
    assert {row["row"]: row["skip"] for row in rows if row["skip"]} == {}
    for seed in ("Databricks train_hvd", "ALCF torch_hvd_mnist"):  # two CPU ranks, gloo
        k_rows = [row for row in rows if row["row"].startswith(f"{seed}, np=-k")]
        assert [row["row"] for row in k_rows] == [
            f"{seed}, np=-k: whole call (s)", f"{seed}, np=-k: steady step (ms)"
        ]  # fmt: skip
        assert all(row["note"].startswith("k=2 CPU ranks (gloo)") for row in k_rows), k_rows
    saves = [row for row in rows if row["case"] == "checkpoint"]
    plain, dcp = "torch.save, fsync, rename", "(FileSystemWriter, sync_files=True)"
    assert [(row["row"], row["peer_name"]) for row in saves] == [
        ("whole save of a 0.000977 GiB state on cpu (s)", plain),
        ("sharded save, one rank (s)", plain),
        ("sharded save, one rank (s)", f"DCP save by hand {dcp}"),
        ("asynchronous save: blocking (s)", plain),
        ("asynchronous save: until durable, wait() (s)", plain),
        ("asynchronous sharded save: blocking (s)", f"DCP async_save by hand {dcp}: its call"),
        ("asynchronous sharded save: until durable, wait() (s)",
         f"DCP async_save by hand {dcp}: until result()"),
    ]  # fmt: skip
    # An asynchronous save's call returns before it is durable, sparktrain's and DCP's.
    for ours, peer in ((3, 4), (5, 6)):
        assert saves[ours]["sparktrain"] <= saves[peer]["sparktrain"], (saves[ours], saves[peer])
    assert saves[5]["peer"] <= saves[6]["peer"], saves[5:]
    targets = {row["row"]: row["target"]["text"] for row in rows if row["target"]}
    assert targets == {
        "Databricks train_hvd, np=-1: whole call (s)": "< 10 s",
        "Databricks train_hvd, np=-1: steady step (ms)": "<= 1.05x plain",
        "ALCF torch_hvd_mnist, np=-1: steady step (ms)": "<= 1.05x plain",
        "warm: run() to the first optimizer step (s)": "<= 2 s",
        "make_torch_dataloader (local Parquet) -> CNN, batch 512 (samples/s)": ">= 0.95x pinned",
        "from_dataframe's stream (Arrow batches fed on the driver) -> CNN (samples/s)": (
            ">= 0.95x pinned"
        ),
        "bf16 autocast CNN step, batch 32 (ms)": "<= 1.05x plain",
    }
    lines = table.splitlines()
    assert lines[0].startswith("CPU (dry run") and "dry run;" in lines[0]
    assert (
        lines[2] == "| case | measure | sparktrain | plain / peer | ratio | target | met? | notes |"
    )
    assert len(lines) == 4 + len(rows)
    for line, row in zip(lines[4:], rows, strict=True):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[:2] == [row["case"], row["row"]]
        assert cells[4] == ("—" if row["ratio"] is None else f"{row['ratio']:.2f}x")


def test_a_case_past_its_deadline_is_stopped_and_the_suite_goes_on(tmp_path: Path) -> None:
    # No interpreter imports torch and sparktrain in 10 ms: first_step cannot make it.
    results, table = dry_run(
        tmp_path, "--case", "first_step", "--case", "checkpoint", "--deadline", "first_step=0.01"
    )

    late, after = results["cases"]["first_step"], results["cases"]["checkpoint"]
    assert late["status"] == "timed out" and late["error"] == "over its deadline of 0 s"
    assert not psutil.pid_exists(late["pid"]) or psutil.Process(late["pid"]).status() == "zombie"
    assert after["status"] == "ok" and after["rows"]
    assert (
        "| first_step | (the whole case) | — | — | — | — | skipped | timed out: over its "
        "deadline of 0 s |" in table
    )


def test_ratios_and_targets_of_the_table() -> None:
    report = report_module()
    row = {"row": "r", "peer_name": "p", "note": "", "skip": None}
    cases = {
        "a": {"status": "ok", "environment": {"device": "GPU X"}, "rows": [
            {**row, "sparktrain": 9.0, "peer": 3.0, "target": {"kind": "value<=", "value": 10.0,
                                                              "text": "< 10 s"}},
            {**row, "sparktrain": 2.0, "peer": 1.0, "target": {"kind": "ratio<=", "value": 1.05,
                                                              "text": "<= 1.05x"}},
            {**row, "sparktrain": 96.0, "peer": 100.0, "target": {"kind": "ratio>=",
                                                                 "value": 0.95, "text": ">="}},
            {**row, "sparktrain": None, "peer": None, "target": None, "skip": "not here"},
        ]},
        "b": {"status": "failed", "error": "Refused: steps differ"},
    }  # fmt: skip

    results = report.assemble(cases, dry=False, wall=12.0)

    assert [(r["case"], r["ratio"], r["met"]) for r in results["rows"]] == [
        ("a", 3.0, True), ("a", 2.0, False), ("a", 0.96, True), ("a", None, None),
        ("b", None, None),
    ]  # fmt: skip
    table = report.markdown(results)
    assert table.startswith("GPU X, torch None")
    assert "| a | r | 9 | 3 | 3.00x | < 10 s | yes | peer: p |" in table
    assert "| a | r | 2 | 1 | 2.00x | <= 1.05x | **no** | peer: p |" in table
    assert "| a | r | — | — | — | — | skipped | not here |" in table
    assert (
        "| b | (the whole case) | — | — | — | — | skipped | failed: Refused: steps differ |"
        in table
    )
