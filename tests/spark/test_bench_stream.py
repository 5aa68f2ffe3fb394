"""The stream benchmark (benchmarks/bench_stream.py) runs at a tiny size on a Spark session of its
own, so it cannot rot: every path's rows, every ratio, the converter's copy in the cache folder
and none from the stream, and its temporary folder removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_stream.py"

pytestmark = [pytest.mark.spark, pytest.mark.slow]


# Its own local-cluster (two executor JVMs), two warm-up runs, then each of the three paths
# once on 4,000 rows: about 80 s on two busy cores.
@pytest.mark.timeout(400)
def test_quick_run_prints_every_path_and_ratio_and_leaves_nothing(tmp_path: Path) -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17+ is needed for Spark")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dir", str(work)],
        cwd=ROOT, capture_output=True, text=True, timeout=390,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    rows = {line.split(" | ")[1]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| 1 | ")}  # fmt: skip
    unagreed = "stream, no step agreement"
    assert set(rows) == {"stream", unagreed, "converter"}, out
    # | round | path | forked | first | epoch 1 | epoch 2 | whole | cache | spill | peak | rows |
    assert rows["converter"][-1] == "4,000, 4,000 |"  # every row, each epoch
    assert rows["stream"][-1] == "4,000, 4,000 |"  # 2 even partitions of 2,000: none left out
    assert rows[unagreed][-1] == "4,000, 4,000 |"
    for stream in ("stream", unagreed):
        assert float(rows[stream][7]) == 0.0  # nothing in the cache folder
        assert float(rows[stream][8]) > 0.0  # the first epoch spilled on the ranks' disks
    assert float(rows["converter"][7]) > 0.0  # its Parquet copy
    for measure in ("(a) run() to the first batch on rank 0 (s)", "(b) epoch 1 (s)",
                    "(b) epoch 2 (s)", "whole path (s)", "(c) MiB written to the cache folder",
                    "(d) peak RSS per rank above start, MiB (max)"):  # fmt: skip
        assert f"\n| {measure} | " in out, out
    assert "\n| (c) MiB written to the cache folder | 0.00 | " in out
    assert "REFUSED" not in proc.stderr
    assert list(work.iterdir()) == []  # its temporary folder is gone
