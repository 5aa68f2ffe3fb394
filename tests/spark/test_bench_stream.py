"""The stream benchmark (benchmarks/bench_stream.py) runs at a tiny size on a Spark session of its
own, so it cannot rot: every path's rows (TorchDistributor's where the installed pyspark has its
``_train_on_dataframe``), every ratio, the converter's copy in the cache folder and none from
the others, the peak RSS at two sizes, and its temporary folder removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_stream.py"
DISTRIBUTOR = "TorchDistributor._train_on_dataframe"

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def has_train_on_dataframe() -> bool:
    try:
        from pyspark.ml.torch.distributor import TorchDistributor
    except ImportError:
        return False
    return hasattr(TorchDistributor, "_train_on_dataframe")


# Its own local-cluster (two executor JVMs), two warm-up runs, then each of the five paths
# once on 4,000 rows and the stream and the ceiling on 16,000: 54 s on two cores at a load
# average of 1-2, 178 s at 10-15 (TorchDistributor's call, with its new torchrun ranks, the
# longest).
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
    unagreed, memory = "stream, no step agreement", "in memory (ceiling)"
    assert set(rows) == {"stream", unagreed, "converter", DISTRIBUTOR, memory}, out
    # | round | path | forked | first | epoch 1 | epoch 2 | whole | cache | spill | peak | rows |
    assert rows["converter"][-1] == "4,000, 4,000 |"  # every row, each epoch
    assert rows["stream"][-1] == "4,000, 4,000 |"  # 2 even partitions of 2,000: none left out
    assert rows[unagreed][-1] == "4,000, 4,000 |"
    assert rows[memory][-1] == "4,000, 4,000 |"
    for stream in ("stream", unagreed):
        assert float(rows[stream][7]) == 0.0  # nothing in the cache folder
        assert float(rows[stream][8]) > 0.0  # the first epoch spilled on the ranks' disks
    assert float(rows["converter"][7]) > 0.0  # its Parquet copy
    assert float(rows[memory][7]) == 0.0 and float(rows[memory][8]) == 0.0
    if has_train_on_dataframe():
        assert rows[DISTRIBUTOR][2] == "no (torchrun)"
        assert rows[DISTRIBUTOR][-1] == "4,000, 4,000 |"  # 2 x (4,000 // 2) each epoch
        assert float(rows[DISTRIBUTOR][7]) == 0.0
        assert float(rows[DISTRIBUTOR][8]) > 0.0  # each task's partition as a local Arrow file
    else:
        assert rows[DISTRIBUTOR][2].startswith("not in the installed pyspark"), out
    for measure in ("(a) run() to the first batch on rank 0 (s)", "(b) epoch 1 (s)",
                    "(b) epoch 2 (s)", "(b) epoch 2, rows/s", "whole path (s)",
                    "(c) MiB written to the cache folder", "MiB spilled locally (all ranks)",
                    "(d) peak RSS per rank above start, MiB (max)"):  # fmt: skip
        assert f"\n| {measure} | " in out, out
    heads = next(line for line in out.splitlines() if line.startswith("| measure | "))
    for quotient in ("stream / converter", "stream / TorchDistributor", "stream / in memory"):
        assert f" {quotient} |" in heads, heads
    # stream, no agreement, converter, distributor, in memory: only the converter writes there
    assert "\n| (c) MiB written to the cache folder | 0.00 | 0.00 | " in out
    assert "(4,000 and 16,000 rows)" in out
    sizes = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
             if line.startswith(("| stream | ", f"| {memory} | "))}  # fmt: skip
    assert set(sizes) == {"stream", memory}, out
    assert float(sizes["stream"][4].rstrip(" |")) > 0.0  # it spilled at the larger size too
    assert "REFUSED" not in proc.stderr
    assert list(work.iterdir()) == []  # its temporary folder is gone
