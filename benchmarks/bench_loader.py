"""Throughput of the Parquet data loader vs an in-memory TensorDataset DataLoader.

Measures samples/s cold (first epoch: for the Parquet loader this includes reading footers
and files, and with --spark the Spark materialization too) and warm (a later epoch), for the
loader's default settings and its thread variants, and prints each as a ratio to the in-memory
DataLoader measured just before it in the same round. Each round measures every loader once
(the variants take turns at going first); round 0 is each kind's first use in the process and
is shown but not summarized. The 1-minute load average is printed before and after every
measurement, so a round that shared the CPUs with other work is visible. Times are printed,
never asserted. The OS page cache is not dropped, so "cold" files are usually in memory.
No rank is launched, so no zygote is involved: "cold" and "warm" are a loader's first and
second epoch in this process.

Every epoch's sample count, cold and warm, must equal ``--rows`` (one shard, no rows
dropped), and each rate is computed from its own epoch's count; otherwise the benchmark stops
with exit status 1 before printing ratios.

    .venv/bin/python benchmarks/bench_loader.py                 # 200k rows x 784 float32
    .venv/bin/python benchmarks/bench_loader.py --rounds 5 --step-ms 2
    .venv/bin/python benchmarks/bench_loader.py --rows 50000 --spark
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from instruments import require
from torch.utils.data import DataLoader, TensorDataset

from sparktrain.data import SparkDatasetConverter, make_spark_converter

BASELINE = "in-memory TensorDataset DataLoader"

# The Parquet loader's settings measured: the defaults first, then the thread variants.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("parquet, defaults (read-ahead thread)", {}),
    ("parquet, prefetch=4 (+ batch thread)", {"prefetch": 4}),
    ("parquet, prefetch=4, read_ahead=False", {"prefetch": 4, "read_ahead": False}),
    ("parquet, no threads (read_ahead=False)", {"read_ahead": False}),
]


@dataclasses.dataclass
class Measurement:
    """One loader measured once: samples/s and the 1-minute load average around it."""

    name: str
    cold: float
    warm: float
    load_before: float
    load_after: float


def load_average() -> float:
    return os.getloadavg()[0]


def make_data(rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    y = rng.integers(0, 10, rows, dtype=np.int64)
    return x, y


def write_parquet(
    x: np.ndarray, y: np.ndarray, path: str, files: int, row_group_bytes: int
) -> None:
    """Like Spark's output: a few part files of ``array<float>`` rows and a long label."""
    os.makedirs(path, exist_ok=True)
    rows_per_group = max(1, row_group_bytes // (x.shape[1] * x.itemsize))
    bounds = np.linspace(0, len(y), files + 1).astype(int)
    for index in range(files):
        lo, hi = bounds[index], bounds[index + 1]
        flat = pa.array(x[lo:hi].reshape(-1))
        offsets = pa.array(np.arange(hi - lo + 1, dtype=np.int32) * x.shape[1])
        table = pa.table(
            {"features": pa.ListArray.from_arrays(offsets, flat), "label": pa.array(y[lo:hi])}
        )
        name = f"{path}/part-{index:05d}.parquet"
        pq.write_table(table, name, row_group_size=rows_per_group)
        # Flushed now, the kernel's writeback of the new files does not land in a measurement.
        with open(name, "rb") as handle:
            os.fsync(handle.fileno())


def drain(batches: Iterable[Any], step_s: float = 0.0) -> int:
    """Consume every batch; returns the number of samples seen.

    ``step_s`` stands for the training step: the consumer waits that long per batch with the
    GIL released, as it would while the GPU works.
    """
    seen = 0
    for batch in batches:
        features = batch["features"] if isinstance(batch, dict) else batch[0]
        seen += int(features.shape[0])
        if step_s:
            time.sleep(step_s)
    return seen


def counted(name: str, epoch: str, samples: int, rows: int) -> int:
    """``samples``, once checked to be every row: a rate over fewer rows measures less work."""
    require(samples == rows, f"{name}: its {epoch} epoch gave {samples} samples, not {rows}")
    return samples


def in_memory(x: np.ndarray, y: np.ndarray, batch_size: int, step_s: float) -> Measurement:
    before = load_average()
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    start = time.perf_counter()
    cold = counted(BASELINE, "cold", drain(loader, step_s), len(y))
    cold_s = time.perf_counter() - start
    start = time.perf_counter()
    warm = counted(BASELINE, "warm", drain(loader, step_s), len(y))
    warm_s = time.perf_counter() - start
    return Measurement(BASELINE, cold / cold_s, warm / warm_s, before, load_average())


def parquet_loader(
    name: str,
    options: dict[str, Any],
    make: Callable[[], SparkDatasetConverter],
    batch_size: int,
    step_s: float,
    rows: int,
) -> tuple[Measurement, SparkDatasetConverter]:
    """Cold: making the converter and the first epoch; warm: the second epoch."""
    before = load_average()
    start = time.perf_counter()
    converter = make()
    with converter.make_torch_dataloader(
        batch_size, cur_shard=0, shard_count=1, **options
    ) as loader:
        cold = counted(name, "cold", drain(loader, step_s), rows)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        warm = counted(name, "warm", drain(loader, step_s), rows)
        warm_s = time.perf_counter() - start
    measured = Measurement(name, cold / cold_s, warm / warm_s, before, load_average())
    return measured, converter


def print_round(label: str, rows: list[Measurement]) -> None:
    base = rows[0]
    header = (
        f"| {label:<7} | {'loader':<42} | {'cold samples/s':>14} | "
        f"{'warm samples/s':>14} | {'ratio cold':>10} | {'ratio warm':>10} | "
        f"{'load before -> after':>20} |"
    )
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for row in rows:
        load = f"{row.load_before:.2f} -> {row.load_after:.2f}"
        print(
            f"| {'':<7} | {row.name:<42} | {row.cold:>14,.0f} | {row.warm:>14,.0f} | "
            f"{row.cold / base.cold:>10.2f} | {row.warm / base.warm:>10.2f} | {load:>20} |"
        )
    print()


def print_summary(rounds: list[list[Measurement]]) -> None:
    """Median ratio over the rounds (each against its own round's baseline), and the range."""
    print(f"Ratios to the in-memory DataLoader over {len(rounds)} round(s): median (min-max)")
    header = f"| {'loader':<42} | {'ratio cold':>18} | {'ratio warm':>18} | {'load seen':>11} |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for index in range(1, len(rounds[0])):
        cold = [r[index].cold / r[0].cold for r in rounds]
        warm = [r[index].warm / r[0].warm for r in rounds]
        loads = [v for r in rounds for v in (r[index].load_before, r[index].load_after)]
        print(
            f"| {rounds[0][index].name:<42} | {spread(cold):>18} | {spread(warm):>18} | "
            f"{min(loads):>4.2f}-{max(loads):<4.2f}  |"
        )


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--files", type=int, default=4, help="Parquet part files (pyarrow path)")
    parser.add_argument("--row-group-bytes", type=int, default=32 << 20)
    parser.add_argument("--rounds", type=int, default=3, help="times every loader is measured")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="simulated training step per batch (ms)"
    )
    parser.add_argument("--spark", action="store_true", help="also go through make_spark_converter")
    parser.add_argument("--master", default="local[2]", help="Spark master for --spark")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    scratch = args.dir or tempfile.mkdtemp(prefix="sparktrain-bench-")
    x, y = make_data(args.rows, args.features)
    print(
        f"{args.rows} rows x {args.features} float32 ({x.nbytes / 2**20:.0f} MiB), batch "
        f"{args.batch_size}, shuffle on, torch threads {torch.get_num_threads()}, "
        f"{os.cpu_count()} CPUs, simulated step {args.step_ms} ms/batch, load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} (1/5/15 min)"
    )
    step_s = args.step_ms / 1000
    rounds: list[list[Measurement]] = []
    try:
        raw = f"{scratch}/raw"
        write_start = time.perf_counter()
        write_parquet(x, y, raw, args.files, args.row_group_bytes)
        print(f"(pyarrow wrote the Parquet files in {time.perf_counter() - write_start:.1f} s)\n")

        def make() -> SparkDatasetConverter:
            return SparkDatasetConverter.from_parquet(raw)

        # Round 0 is the first use in this process of each kind of loader (the allocators
        # grow, thread pools start): shown, but left out of the rounds compared below, so
        # that it does not fall on whichever variant happens to go first.
        first = [
            in_memory(x, y, args.batch_size, step_s),
            parquet_loader(*VARIANTS[0], make, args.batch_size, step_s, args.rows)[0],
        ]
        print_round("round 0", first)
        for number in range(1, args.rounds + 1):
            baseline = in_memory(x, y, args.batch_size, step_s)
            # The variants take turns at going first, so that none always meets the
            # allocator and caches in the state the in-memory loader left them.
            shift = (number - 1) % len(VARIANTS)
            measured: dict[str, Measurement] = {}
            for name, options in VARIANTS[shift:] + VARIANTS[:shift]:
                measured[name], converter = parquet_loader(
                    name, options, make, args.batch_size, step_s, args.rows
                )
            rows = [baseline, *(measured[name] for name, _ in VARIANTS)]
            print_round(f"round {number}", rows)
            rounds.append(rows)
        print(f"(the Parquet files hold {len(converter.pieces)} row groups)")
        print_summary(rounds)
        if args.spark:
            print()
            print_round(
                "spark", [in_memory(x, y, args.batch_size, step_s), spark_row(args, raw, step_s)]
            )
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


def spark_row(args: argparse.Namespace, raw: str, step_s: float) -> Measurement:
    """Cold includes make_spark_converter: Spark reads the raw files and materializes them."""
    from pyspark.sql import SparkSession

    # Python workers (if any) must run this interpreter, which has pyarrow and sparktrain.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    scratch = os.path.dirname(raw)
    try:
        df = spark.read.parquet(f"file://{raw}")
        df.count()  # start the session's first job outside the timing
        measured, converter = parquet_loader(
            "make_spark_converter + loader, defaults",
            {},
            lambda: make_spark_converter(
                df,
                cache_dir=f"file://{scratch}/cache",
                row_group_size_bytes=args.row_group_bytes,
            ),
            args.batch_size,
            step_s,
            args.rows,
        )
        converter.delete()
        return measured
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
