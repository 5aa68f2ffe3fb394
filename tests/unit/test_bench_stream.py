"""The stream benchmark's own logic (benchmarks/bench_stream.py), without Spark: what a rank
counts, how the ranks' results become a row, the row checks that stop it before a ratio, and
the ratio table. Its quick run on a Spark session is tests/spark/test_bench_stream.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests import helpers


def bench_module() -> Any:
    return helpers.bench_module("bench_stream")


def test_a_rank_counts_each_epochs_rows_and_times_every_epoch() -> None:
    bench = bench_module()
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
        ("unagreed", [1000, 999], "unagreed: rows per epoch [1000, 999], not 1000"),
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
    assert capsys.readouterr().err == ""


def test_the_ratio_table_divides_stream_by_converter(capsys: pytest.CaptureFixture[str]) -> None:
    bench = bench_module()
    mib = bench.MIB

    def row(first: float, epochs: list[float], cache: int, peak: int) -> dict[str, Any]:
        return {
            "first": first, "epochs": epochs, "whole": first + sum(epochs), "cache": cache,
            "spill": 0, "peak": peak, "rows": [1000, 1000], "forked": "no",
        }  # fmt: skip

    converter = row(8.0, [2.0, 2.0], mib, -1)
    rounds = [
        {
            "stream": row(2.0, [4.0, 1.0], 0, 50 * mib),
            "unagreed": row(2.0, [4.0, 0.5], 0, 40 * mib),
            "converter": converter,
        },
        {
            "stream": row(4.0, [6.0, 1.0], 0, 50 * mib),
            "unagreed": row(4.0, [6.0, 0.5], 0, 40 * mib),
            "converter": converter,
        },
    ]
    bench.report(rounds, 2)
    out = capsys.readouterr().out
    # | measure | stream | no agreement | converter | stream / conv. | no agreement / conv. |
    assert (
        "| (a) run() to the first batch on rank 0 (s) | 3.00 | 3.00 | 8.00 | 0.38 | 0.38 |" in out
    )
    assert "| (b) epoch 1 (s) | 5.00 | 5.00 | 2.00 | 2.50 | 2.50 |" in out
    assert "| (b) epoch 2 (s) | 1.00 | 0.50 | 2.00 | 0.50 | 0.25 |" in out
    assert "| whole path (s) | 9.00 | 8.50 | 12.00 | 0.75 | 0.71 |" in out
    assert "| (c) MiB written to the cache folder | 0.00 | 0.00 | 1.00 | 0.00 | 0.00 |" in out
    assert "| (d) peak RSS per rank above start, MiB (max) | 50 | 40 | n/a | n/a | n/a |" in out
    assert out.count("\n| 2 | converter | no | 8.00 | 2.00 | 2.00 | 12.00 |") == 1
    assert out.count("\n| 1 | stream, no step agreement | no | 2.00 | 4.00 | 0.50 | ") == 1
