"""The stream benchmark's own logic (benchmarks/bench_stream*.py), without Spark: what a rank
counts, how the ranks' results become a row, the row checks that stop it before a ratio, and
the ratio table. Its quick run on a Spark session is tests/spark/test_bench_stream.py."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import torch

from tests import helpers


def bench_module() -> Any:
    """Its measures, row checks and tables."""
    return helpers.bench_module("bench_stream_report")


def ranks_module() -> Any:
    """What its ranks run."""
    return helpers.bench_module("bench_stream_ranks")


def test_a_rank_counts_each_epochs_rows_and_times_every_epoch() -> None:
    bench = ranks_module()
    epochs = [0, 0, 0, 1, 1, 1]  # the epoch each batch belongs to
    batches = [{"features": torch.ones(n, 4)} for n in (64, 64, 8, 64, 64, 8)]
    seen: list[int] = []

    def epoch_of() -> int:
        seen.append(epochs[len(seen)])
        return seen[-1]

    result = bench.consume(iter(batches), epoch_of, {"step_ms": 0})
    assert result["rows"] == [136, 136]
    assert result["checksum"] == 272.0  # every batch's first column was touched
    assert len(result["epochs"]) == 2 and min(result["epochs"]) >= 0


def test_the_ranks_results_make_one_row() -> None:
    bench = bench_module()
    ranks = [
        {"first": 105.0, "epochs": [2.0, 1.0], "rows": [500, 500], "spill": 10, "peak": 30},
        {"first": 104.0, "epochs": [3.0, 0.5], "rows": [499, 499], "spill": 12, "peak": 50},
    ]
    row = bench.summarize(ranks, start=100.0, end=110.0, cache=0)
    assert row == {
        "first": 5.0,  # rank 0's
        "epochs": [3.0, 1.0],  # the slowest rank's, epoch by epoch
        "whole": 10.0,
        "cache": 0,
        "spill": 22,  # every rank's
        "peak": 50,  # the largest
        "rows": [999, 999],
    }
    ranks[1]["peak"] = -1  # a rank that could not reset its high-water mark
    assert bench.summarize(ranks, 100.0, 110.0, 0)["peak"] == -1


@pytest.mark.parametrize(
    "path, rows, says",
    [
        ("converter", [1000, 999], "converter: rows per epoch [1000, 999], not every one of 1000"),
        ("stream", [1000, 1001], "stream: rows per epoch [1000, 1001]"),
        ("stream", [1000, 900], "stream: rows per epoch [1000, 900]"),
        ("stream", [400, 400], "stream: rows per epoch [400, 400]"),  # more than the rule drops
        ("stream", [1000], "stream: read 1 epochs, not 2"),
        ("own", [1000, 1001], "own: rows per epoch [1000, 1001]"),
        ("own", [1000, 900], "own: rows per epoch [1000, 900]"),
        ("unagreed", [1000, 999], "unagreed: rows per epoch [1000, 999], not 1000"),
        ("memory", [1000, 998], "memory: rows per epoch [1000, 998], not 1000"),
        ("distributor", [1000, 1002], "distributor: rows per epoch [1000, 1002]"),
        ("distributor", [400, 400], "distributor: rows per epoch [400, 400]"),
    ],
)
def test_a_path_that_read_other_rows_stops_the_benchmark(
    path: str, rows: list[int], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_module().check_rows(path, rows, 1000, 2, slack=2 * 256)
    assert stopped.value.code == 1
    assert says in capsys.readouterr().err


def test_rows_the_rules_allow_pass_and_print_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    bench = bench_module()
    bench.check_rows("converter", [1001, 1001], 1000, 2, slack=512)  # padded shards
    bench.check_rows("stream", [900, 900], 1000, 2, slack=512)  # the equal-steps rule
    bench.check_rows("distributor", [998, 998], 999, 2, slack=512)  # np * (rows // np)
    bench.check_rows("memory", [1000, 1000], 1000, 2, slack=512)
    assert capsys.readouterr().err == ""


def row(first: float, epochs: list[float], cache: int, peak: int, spill: int = 0) -> dict:
    return {
        "first": first, "epochs": epochs, "whole": first + sum(epochs), "cache": cache,
        "spill": spill, "peak": peak, "rows": [1000, 1000], "forked": "no",
    }  # fmt: skip


def cells(out: str, label: str) -> list[str]:
    """The cells of the ratio table's line ``label``, after the label."""
    lines = [line for line in out.splitlines() if line.startswith(f"| {label} | ")]
    assert len(lines) == 1, out
    return lines[0].split(" | ")[1:-1] + [lines[0].split(" | ")[-1].rstrip(" |")]


def test_the_ratio_table_divides_the_stream_by_each_other_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = bench_module()
    mib = bench.MIB
    converter = row(8.0, [2.0, 2.0], mib, -1)
    rounds = [
        {
            "stream": row(2.0, [4.0, 1.0], 0, 50 * mib, spill=3 * mib),
            "own": row(2.0, [4.0, 1.0], 0, 45 * mib, spill=3 * mib),
            "unagreed": row(2.0, [4.0, 0.5], 0, 40 * mib),
            "converter": converter,
            "distributor": row(20.0, [8.0, 8.0], 0, 25 * mib, spill=2 * mib),
            "memory": row(1.0, [0.5, 0.5], 0, 100 * mib),
        },
        {
            "stream": row(4.0, [6.0, 1.0], 0, 50 * mib, spill=3 * mib),
            "own": row(2.0, [4.0, 1.0], 0, 45 * mib, spill=3 * mib),
            "unagreed": row(4.0, [6.0, 0.5], 0, 40 * mib),
            "converter": converter,
            "distributor": row(20.0, [8.0, 8.0], 0, 25 * mib, spill=2 * mib),
            "memory": row(1.0, [0.5, 0.5], 0, 100 * mib),
        },
    ]
    bench.report(rounds, 2, {})
    out = capsys.readouterr().out
    # | stream | own partitions | no agreement | converter | distributor | in memory |
    #   then stream / converter, / distributor, / in memory; own partitions / converter,
    #   / distributor; no agreement / converter
    assert cells(out, "(a) run() to the first batch on rank 0 (s)") == [
        "3.00", "2.00", "3.00", "8.00", "20.00", "1.00",
        "0.38", "0.15", "3.00", "0.25", "0.10", "0.38",
    ]  # fmt: skip
    assert cells(out, "(b) epoch 1 (s)") == [
        "5.00", "4.00", "5.00", "2.00", "8.00", "0.50",
        "2.50", "0.62", "10.00", "2.00", "0.50", "2.50",
    ]  # fmt: skip
    assert cells(out, "(b) epoch 2, rows/s") == [  # 1,000 rows over the slowest rank's time
        "1,000", "1,000", "2,000", "500", "125", "2,000",
        "2.00", "8.00", "0.50", "2.00", "8.00", "4.00",
    ]  # fmt: skip
    # the median of the rounds' rates (250 and 167 for the stream), not the rate of a median
    assert cells(out, "(b) epoch 1, rows/s") == [
        "208", "250", "208", "500", "125", "2,000",
        "0.42", "1.67", "0.10", "0.50", "2.00", "0.42",
    ]  # fmt: skip
    assert cells(out, "whole path (s)")[:4] == ["9.00", "7.00", "8.50", "12.00"]
    assert cells(out, "(c) MiB written to the cache folder") == [
        "0.00", "0.00", "0.00", "1.00", "0.00", "0.00", "0.00", "—", "—", "0.00", "—", "0.00",
    ]  # fmt: skip
    assert cells(out, "MiB spilled locally (all ranks)")[:5] == [
        "3.00", "3.00", "0.00", "0.00", "2.00",
    ]  # fmt: skip
    assert cells(out, "(d) peak RSS per rank above start, MiB (max)") == [
        "50", "45", "40", "n/a", "25", "100", "n/a", "2.00", "0.50", "n/a", "1.80", "n/a",
    ]  # fmt: skip
    assert out.count("\n| 2 | converter | no | 8.00 | 2.00 | 2.00 | 12.00 |") == 1
    assert out.count("\n| 1 | stream, no step agreement | no | 2.00 | 4.00 | 0.50 | ") == 1
    assert out.count("\n| 2 | stream, own partitions | no | 2.00 | 4.00 | 1.00 | ") == 1
    assert out.count("\n| 1 | TorchDistributor._train_on_dataframe | no | 20.00 | 8.00 |") == 1


def test_a_path_the_installed_pyspark_lacks_is_said_and_its_ratios_are_na(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = bench_module()
    measured = {
        "stream": row(2.0, [4.0, 1.0], 0, 50),
        "own": row(1.0, [4.0, 1.0], 0, 50),
        "unagreed": row(2.0, [4.0, 0.5], 0, 40),
        "converter": row(8.0, [2.0, 2.0], 10, 60),
        "memory": row(1.0, [0.5, 0.5], 0, 100),
    }
    bench.report([measured], 2, {"distributor": "not in the installed pyspark 3.4.1"})
    out = capsys.readouterr().out
    assert (
        "\n| 1 | TorchDistributor._train_on_dataframe | not in the installed pyspark 3.4.1 |\n"
        in out
    )
    first = cells(out, "(a) run() to the first batch on rank 0 (s)")
    # its cell, stream / TorchDistributor and own partitions / TorchDistributor
    assert first[4] == "n/a" and first[7] == "n/a" and first[10] == "n/a"
    assert first[6] == "0.25" and first[8] == "2.00" and first[9] == "0.12"  # the others divide


def test_the_sizes_table_sets_each_paths_peak_rss_at_two_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = bench_module()
    mib = bench.MIB
    larger = {
        "stream": row(2.0, [4.0, 1.0], 0, 60 * mib, spill=400 * mib),
        "memory": row(1.0, [0.5, 0.5], 0, 400 * mib),
    }
    bench.sizes_report({"stream": 50 * mib, "memory": 100 * mib}, larger, 1000, 4)
    out = capsys.readouterr().out
    assert "(1,000 and 4,000 rows)" in out
    assert "\n| stream | 50 | 60 | 1.20 | 400 |" in out
    assert "\n| in memory (ceiling) | 100 | 400 | 4.00 | 0.00 |" in out


def test_the_ceiling_reads_its_share_in_batches_of_the_size_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ceiling's rank function, in a one-rank gloo group: its share, every epoch."""
    import torch.distributed as dist

    bench = ranks_module()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    job = {"rows": 1000, "features": 4, "batch_size": 64, "epochs": 2, "seed": 7, "step_ms": 0}
    try:
        (rank,) = bench.rank_memory(job)["ranks"]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert rank["rows"] == [1000, 1000]
    assert rank["spill"] == 0 and len(rank["epochs"]) == 2
