"""The stream benchmark (benchmarks/bench_stream.py) runs at a tiny size on the tier's shared
session, so it cannot rot: every path's rows (TorchDistributor's where the installed pyspark has
its ``_train_on_dataframe``), every ratio, the converter's copy in the cache folder and none
from the others, the peak RSS at two sizes, and its temporary folder removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import helpers

DISTRIBUTOR = "TorchDistributor._train_on_dataframe"

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def has_train_on_dataframe() -> bool:
    try:
        from pyspark.ml.torch.distributor import TorchDistributor
    except ImportError:
        return False
    return hasattr(TorchDistributor, "_train_on_dataframe")


# On the shared local-cluster session (two executor JVMs; its start is the tier's, not this
# test's), no warm-up runs (the first path of each kind of stage starts its workers): each of
# the six paths once on 4,000 rows, then the stream and the ceiling on 16,000. TorchDistributor's
# call, with its new torchrun ranks, is the longest.
@pytest.mark.timeout(400)
def test_quick_run_prints_every_path_and_ratio_and_leaves_nothing(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    bench = helpers.bench_module("bench_stream")
    try:
        bench.main(["--quick", "--dir", str(work)], spark=spark)
    except SystemExit as stopped:  # a path that read other rows than its ratio compares
        captured = capsys.readouterr()
        pytest.fail(f"exit {stopped.code}: {captured.out[-3000:]}{captured.err[-3000:]}")
    captured = capsys.readouterr()
    out = captured.out
    assert not spark.sparkContext._jsc.sc().isStopped()  # a session it was given stays up
    rows = {line.split(" | ")[1]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| 1 | ")}  # fmt: skip
    own = "stream, own partitions"
    unagreed, memory = "stream, no step agreement", "in memory (ceiling)"
    assert set(rows) == {"stream", own, unagreed, "converter", DISTRIBUTOR, memory}, out
    # | round | path | forked | first | epoch 1 | epoch 2 | whole | cache | spill | peak | rows |
    assert rows["converter"][-1] == "4,000, 4,000 |"  # every row, each epoch
    assert rows["stream"][-1] == "4,000, 4,000 |"  # 2 even partitions of 2,000: none left out
    assert rows[own][-1] == "4,000, 4,000 |"  # spark.range's 2 partitions of 2,000
    assert rows[unagreed][-1] == "4,000, 4,000 |"
    assert rows[memory][-1] == "4,000, 4,000 |"
    for stream in ("stream", own, unagreed):
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
    for quotient in ("stream / converter", "stream / TorchDistributor", "stream / in memory",
                     "own partitions / converter", "own partitions / TorchDistributor"):  # fmt: skip
        assert f" {quotient} |" in heads, heads
    # stream, own partitions, no agreement, converter, ...: only the converter writes there
    assert "\n| (c) MiB written to the cache folder | 0.00 | 0.00 | 0.00 | " in out
    assert "(4,000 and 16,000 rows)" in out
    sizes = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
             if line.startswith(("| stream | ", f"| {memory} | "))}  # fmt: skip
    assert set(sizes) == {"stream", memory}, out
    assert float(sizes["stream"][4].rstrip(" |")) > 0.0  # it spilled at the larger size too
    assert "REFUSED" not in captured.err
    assert list(work.iterdir()) == []  # its temporary folder is gone
