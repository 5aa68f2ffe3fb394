"""Throughput of the Parquet data loader vs an in-memory TensorDataset DataLoader.

Prints a table of samples/s, cold (first epoch: for the Parquet loader this includes reading
footers and files, and with --spark the Spark materialization too) and warm (a later epoch),
with the ratio to the in-memory loader. Times are printed, never asserted. The OS page cache
is not dropped, so "cold" files are usually in memory already.

    .venv/bin/python benchmarks/bench_loader.py                 # 200k rows x 784 float32
    .venv/bin/python benchmarks/bench_loader.py --rows 50000 --spark
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, TensorDataset

from sparktrain.data import SparkDatasetConverter, make_spark_converter


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
        pq.write_table(table, f"{path}/part-{index:05d}.parquet", row_group_size=rows_per_group)


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


def timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    samples = run()
    return time.perf_counter() - start, samples


def in_memory(x: np.ndarray, y: np.ndarray, batch_size: int, step_s: float) -> tuple[float, float]:
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    cold_s, samples = timed(lambda: drain(loader, step_s))
    warm_s, _ = timed(lambda: drain(loader, step_s))
    return samples / cold_s, samples / warm_s


def parquet_loader(
    make: Callable[[], SparkDatasetConverter], batch_size: int, prefetch: int, step_s: float
) -> tuple[float, float, SparkDatasetConverter]:
    start = time.perf_counter()
    converter = make()
    with converter.make_torch_dataloader(
        batch_size, cur_shard=0, shard_count=1, prefetch=prefetch
    ) as loader:
        samples = drain(loader, step_s)
        cold_s = time.perf_counter() - start
        warm_s, _ = timed(lambda: drain(loader, step_s))
    return samples / cold_s, samples / warm_s, converter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--files", type=int, default=4, help="Parquet part files (pyarrow path)")
    parser.add_argument("--row-group-bytes", type=int, default=32 << 20)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="simulated training step per batch (ms)"
    )
    parser.add_argument("--spark", action="store_true", help="also go through make_spark_converter")
    parser.add_argument("--master", default="local[2]", help="Spark master for --spark")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()

    scratch = args.dir or tempfile.mkdtemp(prefix="sparktrain-bench-")
    x, y = make_data(args.rows, args.features)
    print(
        f"{args.rows} rows x {args.features} float32 ({x.nbytes / 2**20:.0f} MiB), batch "
        f"{args.batch_size}, shuffle on, torch threads {torch.get_num_threads()}, "
        f"{os.cpu_count()} CPUs, simulated step {args.step_ms} ms/batch"
    )
    step_s = args.step_ms / 1000
    results: list[tuple[str, float, float]] = []
    try:
        results.append(("in-memory TensorDataset", *in_memory(x, y, args.batch_size, step_s)))
        raw = f"{scratch}/raw"
        write_start = time.perf_counter()
        write_parquet(x, y, raw, args.files, args.row_group_bytes)
        write_s = time.perf_counter() - write_start
        # Warm the process (Arrow's allocator and thread pool) so that the first loader
        # measured does not pay for it alone.
        pq.ParquetFile(f"{raw}/part-00000.parquet").read_row_group(0)
        for prefetch in (args.prefetch, 0):
            cold, warm, converter = parquet_loader(
                lambda: SparkDatasetConverter.from_parquet(raw), args.batch_size, prefetch, step_s
            )
            name = f"parquet loader, prefetch={prefetch} ({len(converter.pieces)} row groups)"
            results.append((name, cold, warm))
        if args.spark:
            results.append(spark_row(args, raw, scratch, step_s))
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    base_cold, base_warm = results[0][1], results[0][2]
    print(f"(pyarrow wrote the Parquet files in {write_s:.1f} s, not counted below)\n")
    header = f"| {'loader':<46} | {'cold samples/s':>14} | {'warm samples/s':>14} | {'ratio cold':>10} | {'ratio warm':>10} |"
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for name, cold, warm in results:
        print(
            f"| {name:<46} | {cold:>14,.0f} | {warm:>14,.0f} | {cold / base_cold:>10.2f} | "
            f"{warm / base_warm:>10.2f} |"
        )


def spark_row(
    args: argparse.Namespace, raw: str, scratch: str, step_s: float
) -> tuple[str, float, float]:
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
    try:
        df = spark.read.parquet(f"file://{raw}")
        df.count()  # start the session's first job outside the timing
        cold, warm, converter = parquet_loader(
            lambda: make_spark_converter(
                df,
                cache_dir=f"file://{scratch}/cache",
                row_group_size_bytes=args.row_group_bytes,
            ),
            args.batch_size,
            args.prefetch,
            step_s,
        )
        name = f"make_spark_converter + loader ({len(converter.pieces)} row groups)"
        converter.delete()
        return name, cold, warm
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
