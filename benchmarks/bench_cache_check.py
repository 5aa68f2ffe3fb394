"""What checking a data cache's part files as the ranks read them costs.

A converter made by ``make_spark_converter`` carries each part file's recorded size and
SHA-256, and its loaders check every file as they open it (``sparktrain.data.verified``); a
converter over files of your own (``from_parquet``) reads them unchecked, memory-mapped. This
measures, on the same files in the same run:

* ``open+read``: opening every file and decoding every row group, once, with a fresh
  checker (so every file is hashed), against the same with no check;
* ``again``: the same a second time in the process (an unchanged file is not hashed again);
* ``others may write``: the files group-writable, so each opening copies and hashes them;
* ``loader epoch``: a shuffled epoch of the loader (defaults, one shard), samples/s.

Each line is a ratio of rates against the unchecked reading measured right before it, in
the same round; the table shows the median over the rounds and their spread. Times are
printed, never asserted. The page cache is not dropped: the files are in memory, which is the
case where hashing costs most relative to reading.

    .venv/bin/python benchmarks/bench_cache_check.py
    .venv/bin/python benchmarks/bench_cache_check.py --files 8 --mib 64 --rounds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from instruments import require

from sparktrain.data import SparkDatasetConverter, integrity
from sparktrain.data.dataset import filesystem


def write_files(folder: str, files: int, mib: int) -> list[str]:
    """``files`` Parquet files of about ``mib`` MiB each (float32 features, 4 MiB row groups)."""
    rows = mib * (1 << 20) // (64 * 4)
    rng = np.random.default_rng(0)
    names = []
    for index in range(files):
        features = rng.random((rows, 64), dtype=np.float32)
        table = pa.table(
            {
                "features": pa.FixedSizeListArray.from_arrays(features.reshape(-1), 64),
                "label": rng.integers(0, 10, rows),
            }
        )
        name = f"part-{index:05d}.parquet"
        pq.write_table(
            table,
            os.path.join(folder, name),
            row_group_size=rows // (mib // 4 or 1),
            compression="none",
        )
        os.chmod(os.path.join(folder, name), 0o644)
        names.append(name)
    return names


def read_all(converter: SparkDatasetConverter) -> int:
    """Open every file and decode every row group; the bytes decoded."""
    decoded = 0
    for index in range(len(converter.files)):
        parquet, handle = converter.open_file(index)
        for group in range(parquet.num_row_groups):
            decoded += parquet.read_row_group(group).nbytes
        handle.close()
    return decoded


def epoch(converter: SparkDatasetConverter) -> int:
    with converter.make_torch_dataloader(
        256, num_epochs=1, shuffle=True, cur_shard=0, shard_count=1
    ) as loader:
        return sum(len(batch["label"]) for batch in loader)


def timed(work: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    amount = work()
    return time.perf_counter() - start, amount


def fresh(converter: SparkDatasetConverter) -> SparkDatasetConverter:
    """The same converter, without what its process has hashed already."""
    return dataclasses.replace(converter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=32, help="size of each file")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-cache-check-")
    try:
        names = write_files(folder, args.files, args.mib)
        plain = SparkDatasetConverter.from_parquet(f"file://{folder}", files=names)
        fs, root = filesystem(plain.url)
        checked = dataclasses.replace(plain, digests=integrity.record(fs, root, names))
        total = sum(os.path.getsize(os.path.join(folder, n)) for n in names)
        print(f"{args.files} files, {total / (1 << 20):.0f} MiB in all, in {folder}")
        print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
        ratios: dict[str, list[float]] = {}
        rates: dict[str, list[float]] = {}

        def measure(name: str, base: Callable[[], int], other: Callable[[], int]) -> None:
            t_base, n_base = timed(base)
            t_other, n_other = timed(other)
            require(n_base == n_other, f"{name}: {n_base} != {n_other}")
            ratios.setdefault(name, []).append(t_base / t_other)
            rates.setdefault(name, []).append(n_other / t_other)
            rates.setdefault(f"{name} (unchecked)", []).append(n_base / t_base)

        for _ in range(args.rounds):
            first = fresh(checked)
            measure("open+read, first", lambda: read_all(fresh(plain)), lambda f=first: read_all(f))
            measure("open+read, again", lambda: read_all(plain), lambda f=first: read_all(f))
            measure("loader epoch", lambda: epoch(fresh(plain)), lambda: epoch(fresh(checked)))
            for name in names:
                os.chmod(os.path.join(folder, name), 0o664)
            measure(
                "open+read, others may write",
                lambda: read_all(fresh(plain)),
                lambda: read_all(fresh(checked)),
            )
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}\n")
        print(f"{'measurement':34} {'checked':>16} {'unchecked':>16} {'checked/unchecked':>18}")
        for name, values in ratios.items():
            unit = "samples/s" if name == "loader epoch" else "MiB/s"
            scale = 1 if unit == "samples/s" else 1 / (1 << 20)
            mine = statistics.median(rates[name]) * scale
            base = statistics.median(rates[f"{name} (unchecked)"]) * scale
            spread = f"{min(values):.2f}-{max(values):.2f}"
            print(
                f"{name:34} {mine:>10.0f} {unit:>5} {base:>10.0f} {unit:>5} "
                f"{statistics.median(values):>8.2f} ({spread})"
            )
        print("\n(rates of bytes decoded for open+read; a ratio under 1 is the check's cost)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
