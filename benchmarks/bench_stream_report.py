"""``bench_stream.py``'s measures and tables: one path's measures from its ranks' results, the
check of its rows, the per-round table, the ratios (medians over the rounds) and the peak RSS at
two sizes."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from instruments import require

PATHS = ("stream", "own", "unagreed", "converter", "distributor", "memory")
NAMES = {
    "stream": "stream",
    "own": "stream, own partitions",
    "unagreed": "stream, no step agreement",
    "converter": "converter",
    "distributor": "TorchDistributor._train_on_dataframe",
    "memory": "in memory (ceiling)",
}
# The paths measured again at ``--larger`` times the rows, for their peak RSS.
LARGER_PATHS = ("stream", "memory")
MIB = 1 << 20
# The ratio table's quotients: (numerator path, denominator path, heading).
QUOTIENTS = (
    ("stream", "converter", "stream / converter"),
    ("stream", "distributor", "stream / TorchDistributor"),
    ("stream", "memory", "stream / in memory"),
    ("own", "converter", "own partitions / converter"),
    ("own", "distributor", "own partitions / TorchDistributor"),
    ("unagreed", "converter", "no step agreement / converter"),
)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 where it is absent)."""
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def summarize(ranks: list[dict[str, Any]], start: float, end: float, cache: int) -> dict:
    """One path's measures in one round, from every rank's result."""
    epochs = [max(col) for col in zip(*(r["epochs"] for r in ranks), strict=True)]
    peaks = [r["peak"] for r in ranks]
    return {
        "first": ranks[0]["first"] - start,
        "epochs": epochs,
        "whole": end - start,
        "cache": cache,
        "spill": sum(r["spill"] for r in ranks),
        "peak": max(peaks) if min(peaks) >= 0 else -1,
        "rows": [sum(col) for col in zip(*(r["rows"] for r in ranks), strict=True)],
    }


def check_rows(path: str, rows: list[int], total: int, epochs: int, slack: int) -> None:
    """Refuse a round whose path did not read what the ratio compares (see the docstring)."""
    require(len(rows) == epochs, f"{path}: read {len(rows)} epochs, not {epochs}")
    if path == "converter":
        ok = all(total <= r < total + slack for r in rows)  # padded by < one row per rank
        require(ok, f"converter: rows per epoch {rows}, not every one of {total}")
    elif path in ("unagreed", "memory"):  # every rank reads its whole share
        require(rows == [total] * epochs, f"{path}: rows per epoch {rows}, not {total}")
    else:  # the streams' equal-steps rule; the distributor's rows // np on every rank
        ok = all(total - slack < r <= total for r in rows) and len(set(rows)) == 1
        require(ok, f"{path}: rows per epoch {rows}, not {total} less the equal-steps rule's")


def ratio(stream: float | None, other: float | None) -> str:
    if stream is None or other is None or stream < 0 or other < 0:
        return "n/a"
    if other == 0:
        return "—" if stream == 0 else "inf"
    return f"{stream / other:.2f}"


def fmt_mib(value: float | None) -> str:
    if value is None or value < 0:
        return "n/a"
    return f"{value / MIB:,.0f}" if value >= 10 * MIB else f"{value / MIB:,.2f}"


def fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def rates(measure: dict[str, Any]) -> list[float]:
    """Rows per second in each epoch: all ranks' rows over the slowest rank's time."""
    return [
        rows / seconds if seconds > 0 else float("inf")
        for rows, seconds in zip(measure["rows"], measure["epochs"], strict=True)
    ]


def median_of(rounds: list[dict[str, dict]], path: str, key: str, index: int = -1) -> Any:
    """The median over the rounds that measured ``path`` (None where none did)."""
    measures = [r[path] for r in rounds if path in r]
    if not measures:
        return None
    if key == "rate":
        return statistics.median(rates(m)[index] for m in measures)
    return statistics.median(m[key][index] if index >= 0 else m[key] for m in measures)


def report(rounds: list[dict[str, dict]], epochs: int, missing: dict[str, str]) -> None:
    """The per-round table, then the ratios (medians over the rounds). ``missing``: the paths
    that could not run, and why (their rows say so; their cells and ratios are n/a)."""
    epoch_heads = "".join(f" epoch {e + 1} (s) |" for e in range(epochs))
    print(
        f"\n| round | path | rank 0 forked | first batch (s) |{epoch_heads} whole (s) "
        "| MiB to the cache folder | MiB spilled locally (all ranks) | peak RSS per rank, MiB "
        "(max) | rows per epoch |"
    )
    print("|---" * (9 + epochs) + "|")
    for number, measures in enumerate(rounds, 1):
        for path in PATHS:
            if path in missing:
                print(f"| {number} | {NAMES[path]} | {missing[path]} |")
                continue
            m = measures[path]
            cells = "".join(f" {t:.2f} |" for t in m["epochs"])
            print(
                f"| {number} | {NAMES[path]} | {m['forked']} | {m['first']:.2f} |{cells} "
                f"{m['whole']:.2f} | {fmt_mib(m['cache'])} | {fmt_mib(m['spill'])} "
                f"| {fmt_mib(m['peak'])} | {', '.join(f'{r:,}' for r in m['rows'])} |"
            )
    print(f"\nRatios (median over {len(rounds)} round(s)):\n")
    heads = " | ".join(NAMES[path] for path in PATHS)
    quotients = " | ".join(head for _, _, head in QUOTIENTS)
    print(f"| measure | {heads} | {quotients} |")
    print("|---" * (1 + len(PATHS) + len(QUOTIENTS)) + "|")
    lines: list[tuple[str, str, int, Any]] = [
        ("(a) run() to the first batch on rank 0 (s)", "first", -1, fmt_s)
    ]
    lines += [(f"(b) epoch {e + 1} (s)", "epochs", e, fmt_s) for e in range(epochs)]
    lines += [(f"(b) epoch {e + 1}, rows/s", "rate", e, fmt_rate) for e in range(epochs)]
    lines += [("whole path (s)", "whole", -1, fmt_s)]
    lines += [("(c) MiB written to the cache folder", "cache", -1, fmt_mib)]
    lines += [("MiB spilled locally (all ranks)", "spill", -1, fmt_mib)]
    lines += [("(d) peak RSS per rank above start, MiB (max)", "peak", -1, fmt_mib)]
    for label, key, index, fmt in lines:
        value = {path: median_of(rounds, path, key, index) for path in PATHS}
        cells = " | ".join(fmt(value[path]) for path in PATHS)
        ratios = " | ".join(ratio(value[a], value[b]) for a, b, _ in QUOTIENTS)
        print(f"| {label} | {cells} | {ratios} |")


def sizes_report(smaller: dict[str, Any], larger: dict[str, Any], rows: int, factor: int) -> None:
    """Peak RSS per rank at ``rows`` and at ``factor`` times as many, path by path."""
    print(f"\nPeak RSS per rank at two sizes ({rows:,} and {rows * factor:,} rows):\n")
    print(
        f"| path | peak RSS per rank at {rows:,} rows, MiB (max) | at {rows * factor:,} rows "
        "| larger / smaller | MiB spilled locally at the larger |"
    )
    print("|---|---|---|---|---|")
    for path in LARGER_PATHS:
        small, large = smaller.get(path), larger.get(path)
        if small is None or large is None:
            continue
        print(
            f"| {NAMES[path]} | {fmt_mib(small)} | {fmt_mib(large['peak'])} "
            f"| {ratio(large['peak'], small)} | {fmt_mib(large['spill'])} |"
        )
