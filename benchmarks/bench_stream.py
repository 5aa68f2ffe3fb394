"""Training straight from a DataFrame (``from_dataframe``) against the converter's Parquet copy,
TorchDistributor's private ``_train_on_dataframe`` and rows already in memory (the ceiling).

One generated DataFrame (``--rows`` rows of ``--features`` float32 features in an array column
and an integer label, computed by Spark from ``spark.range``) is read by ``--np`` ranks on an
embedded Spark session (``--master``, by default ``local-cluster[2,1,1024]``: two executor
JVMs) in five ways, through the calls users make:

* **stream**: ``SparkRunner(np).run(train, data=from_dataframe(df, batch_size, num_epochs))``:
  the run's barrier stage runs over ``df.repartition(np)`` and each task streams its
  partition's Arrow batches to its ranks; epochs after the first read each rank's local spill;
* **stream, no step agreement**: the same, with the ranks joining their process group only
  once the loader is open, so the loader does not agree on its steps (one all-reduce per 16
  batches): what that agreement costs (a DDP loop pays it beside its own all-reduce per step);
* **converter**: ``make_spark_converter(df, cache_dir=...)`` (Spark writes a Parquet copy
  into the cache folder), then ``run(train, converter=...)`` with
  ``make_torch_dataloader(batch_size, num_epochs=1)`` read ``--epochs`` times on each rank;
* **TorchDistributor._train_on_dataframe** (where the installed pyspark has it; otherwise its
  row says so): ``TorchDistributor(np, local_mode=False, use_gpu=False)._train_on_dataframe(
  train, df.repartition(np))``: each barrier task writes its whole partition to a local Arrow
  file (under ``SparkFiles``' root, a local dir) and then starts its rank with torchrun; the
  rank reads the file through ``_get_spark_partition_data_loader(rows // np, batch_size,
  num_workers=0)`` once per epoch (its loader does not shuffle, and wraps around a shorter
  partition so that every rank takes ``rows // np`` rows);
* **in memory (ceiling)**: ``run(train)`` whose ranks make their share of the rows as tensors
  before the first epoch and read them in shuffled batches of the same size.

A training step is stood for by touching every batch's features (and ``--step-ms`` of sleep,
if given). Per path it prints:

* (a) the time from the path's first call (``run()``; ``make_spark_converter`` for the
  converter; ``_train_on_dataframe`` for TorchDistributor) to the first batch on rank 0 (both
  clocks are this machine's: the session is embedded);
* (b) each epoch's time, the slowest rank's, from the end of the epoch before it (for the first:
  from the loader's opening) to its last batch, and its rows/s (all ranks' rows over it);
* (c) the bytes written to the cache folder (the converter's Parquet copy; no other path
  writes there) and, apart, the bytes the ranks wrote to their local disks (the stream's
  spill; TorchDistributor's Arrow files);
* (d) each rank's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs`` before the loader
  opens) above what it held then, the largest over the ranks (without the step agreement,
  joining the process group counts in it; the ceiling's counts its rows);

and the whole path's time, then a table of the medians and of the ratios: stream / converter,
stream / TorchDistributor, stream / in memory, and no step agreement / converter. With
``--larger K`` (default 4) the stream and the ceiling run once more on a DataFrame of K times
the rows, and a last table sets their peak RSS per rank at the two sizes side by side.
Each path's row counts are checked before a ratio is printed: the converter reads every row in
each epoch (its shards padded to equal size), the stream every row but those the equal-steps
rule leaves out (fewer than ``np * batch_size``), the same in every epoch, TorchDistributor
``np * (rows // np)`` each epoch, and without the agreement and in memory every row;
otherwise the benchmark stops with exit status 1. Two warm-up runs first start the executors'
Python workers of both kinds of stage (over tasks, and over a DataFrame: ``mapInArrow``'s
workers are others), so every path is measured warm (TorchDistributor's ranks are new torchrun
processes on every call); each row says whether rank 0 was forked from a zygote. With
``--rounds`` above 1 the paths take turns at going first and the ratios are medians over the
rounds. Times are printed, never asserted. Files go to a private temporary folder under
``--dir`` (default: the system's), removed at the end.

    .venv/bin/python benchmarks/bench_stream.py                       # 200k rows x 64, np=2
    .venv/bin/python benchmarks/bench_stream.py --rows 1000000 --rounds 3
    .venv/bin/python benchmarks/bench_stream.py --quick               # 4,000 rows x 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from instruments import rank0_forked, require

from sparktrain import SparkRunner
from sparktrain.data import from_dataframe, make_spark_converter

PATHS = ("stream", "unagreed", "converter", "distributor", "memory")
NAMES = {
    "stream": "stream",
    "unagreed": "stream, no step agreement",
    "converter": "converter",
    "distributor": "TorchDistributor._train_on_dataframe",
    "memory": "in memory (ceiling)",
}
# The paths measured again at ``--larger`` times the rows, for their peak RSS.
LARGER_PATHS = ("stream", "memory")
MIB = 1 << 20
# The measures of one path in one round, in the order of the tables' columns.
MEASURES = ("first", "epochs", "whole", "cache", "spill", "peak")


def consume(batches: Any, epoch_of: Any, job: dict[str, Any]) -> dict[str, Any]:
    """On a rank: read every batch, timing the first and each epoch's end; rows per epoch."""
    import time

    opened = time.time()
    first: float | None = None
    ends: list[float] = []
    rows: list[int] = []
    step_s = job["step_ms"] / 1000
    checksum = 0.0
    for batch in batches:
        now = time.time()
        epoch = epoch_of()
        if first is None:
            first = now
        while len(rows) <= epoch:
            rows.append(0)
            ends.append(now)
        features = batch["features"]
        checksum += float(features[:, 0].sum())  # the step: every batch is touched
        if step_s:
            time.sleep(step_s)
        rows[epoch] += int(features.shape[0])
        ends[epoch] = time.time()
    starts = [opened, *ends[:-1]]
    return {
        "first": first if first is not None else float("nan"),
        "epochs": [end - start for start, end in zip(starts, ends, strict=True)],
        "rows": rows,
        "checksum": checksum,
    }


def measured(job: dict[str, Any], read: Any, join_first: bool = True) -> dict[str, Any]:
    """On a rank: join the process group, reset the peak RSS, ``read()``; every rank's result.

    ``read`` returns :func:`consume`'s dict and the bytes this rank spilled. With
    ``join_first=False``, ``read`` joins the group itself, once its loader is open (a loader
    opened before the group exists does not agree on its steps).
    """
    import torch.distributed as dist

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return -1

    if join_first:
        dist.init_process_group("gloo")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    before = status("VmRSS")
    result, spilled = read()
    result["peak"] = status("VmHWM") - before if reset else -1
    result["spill"] = spilled
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    dist.destroy_process_group()
    return {"ranks": everyone}


def rank_stream(data: Any, job: dict[str, Any]) -> dict[str, Any]:
    """On every rank: the stream's loader, ``num_epochs`` epochs in one pass."""

    import torch.distributed as dist

    def read() -> tuple[dict[str, Any], int]:
        spilled = [0]
        with data.loader() as batches:
            if not dist.is_initialized():  # only now: this loader's ranks do not agree
                dist.init_process_group("gloo")

            def epoch_of() -> int:
                # The spill is whole once epoch 1 begins: its size is what the rank wrote.
                if batches.epoch == 1 and not spilled[0]:
                    spill = getattr(getattr(batches, "_stream", None), "_spill", None)
                    path = getattr(spill, "path", None)
                    spilled[0] = path.stat().st_size if path is not None and path.exists() else 0
                return int(batches.epoch)

            result = consume(batches, epoch_of, job)
        return result, spilled[0]

    return measured(job, read, join_first=job["agree"])


def rank_converter(converter: Any, job: dict[str, Any]) -> dict[str, Any]:
    """On every rank: ``make_torch_dataloader`` read ``epochs`` times (one epoch a pass)."""

    def read() -> tuple[dict[str, Any], int]:
        epoch = [0]

        def passes() -> Any:
            with converter.make_torch_dataloader(
                job["batch_size"], num_epochs=1, shuffle=True, seed=job["seed"]
            ) as loader:
                for number in range(job["epochs"]):
                    epoch[0] = number
                    yield from loader

        return consume(passes(), lambda: epoch[0], job), 0

    return measured(job, read)


def rank_distributor(job: dict[str, Any]) -> dict[str, Any]:
    """On every rank of ``TorchDistributor._train_on_dataframe`` (a torchrun process): its
    partition's local Arrow file read through ``_get_spark_partition_data_loader``, once per
    epoch, ``rows // np`` rows each time (its loader wraps around where a partition is shorter:
    every rank takes the same steps). It does not shuffle; ``num_workers=0`` keeps the reading
    in the rank, so that its peak RSS counts it."""
    import os

    import torch.distributed as dist
    from pyspark.ml.torch.distributor import (
        SPARK_PARTITION_ARROW_DATA_FILE,
        _get_spark_partition_data_loader,
    )

    def read() -> tuple[dict[str, Any], int]:
        per_rank = job["rows"] // dist.get_world_size()
        epoch = [0]

        def passes() -> Any:
            for number in range(job["epochs"]):
                epoch[0] = number
                loader = _get_spark_partition_data_loader(
                    per_rank, job["batch_size"], num_workers=0
                )
                for features, label in loader:
                    yield {"features": features, "label": label}

        result = consume(passes(), lambda: epoch[0], job)
        return result, os.path.getsize(os.environ[SPARK_PARTITION_ARROW_DATA_FILE])

    return measured(job, read)


def rank_memory(job: dict[str, Any]) -> dict[str, Any]:
    """On every rank (the ceiling): its share of the rows made as tensors in the rank before the
    first epoch (counted in its peak RSS, not in its epochs), read in batches of the same size,
    shuffled every epoch."""
    import torch
    import torch.distributed as dist

    def read() -> tuple[dict[str, Any], int]:
        rank, size = dist.get_rank(), dist.get_world_size()
        rows = job["rows"] // size + (1 if rank < job["rows"] % size else 0)
        generator = torch.Generator().manual_seed(job["seed"] + rank)
        features = torch.rand(rows, job["features"], generator=generator)
        labels = torch.randint(0, 10, (rows,), generator=generator)
        epoch = [0]
        step = job["batch_size"]

        def passes() -> Any:
            for number in range(job["epochs"]):
                epoch[0] = number
                order = torch.randperm(rows, generator=generator)
                for start in range(0, rows, step):
                    index = order[start : start + step]
                    yield {"features": features[index], "label": labels[index]}

        return consume(passes(), lambda: epoch[0], job), 0

    return measured(job, read)


def distributor_missing() -> str | None:
    """Why the TorchDistributor path cannot run with the installed pyspark (None: it can)."""
    import pyspark

    try:
        from pyspark.ml.torch import distributor
    except ImportError as error:
        return f"not in the installed pyspark {pyspark.__version__} ({error})"
    needed = ("_get_spark_partition_data_loader", "SPARK_PARTITION_ARROW_DATA_FILE")
    if not hasattr(distributor.TorchDistributor, "_train_on_dataframe") or not all(
        hasattr(distributor, name) for name in needed
    ):
        return f"not in the installed pyspark {pyspark.__version__}"
    return None


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
    else:  # the stream's equal-steps rule; the distributor's rows // np on every rank
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


# The ratio table's quotients: (numerator path, denominator path, heading).
QUOTIENTS = (
    ("stream", "converter", "stream / converter"),
    ("stream", "distributor", "stream / TorchDistributor"),
    ("stream", "memory", "stream / in memory"),
    ("unagreed", "converter", "no step agreement / converter"),
)


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


def session(master: str, partitions: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors: this interpreter
    return (
        SparkSession.builder.master(master)
        .appName("bench-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .getOrCreate()
    )


def frame(spark: Any, rows: int, features: int, partitions: int) -> Any:
    """``rows`` rows: ``features`` (array<float>, uniform in [0, 1)) and ``label`` (0-9)."""
    from pyspark.sql import functions as F

    values = [F.rand(seed=column) for column in range(features)]
    return spark.range(rows, numPartitions=partitions).select(
        F.array(*values).cast("array<float>").alias("features"),
        (F.col("id") % 10).cast("long").alias("label"),
    )


def warm_up(data: Any = None) -> int:
    """A run with nothing to measure: starts the Python workers each kind of stage uses."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rows = 0
    if data is not None:
        with data.loader() as batches:
            rows = sum(len(batch["label"]) for batch in batches)
    dist.destroy_process_group()
    return rows


def warm_both(spark: Any, np: int) -> None:
    """Warm-up runs of both kinds of stage: a stage over tasks (the converter's runs), and one
    over a DataFrame (``mapInArrow``, whose Python workers are others)."""
    SparkRunner(np=np, timeout=3600).run(warm_up)
    tiny = spark.range(64).selectExpr("id AS label")
    SparkRunner(np=np, timeout=3600).run(warm_up, data=from_dataframe(tiny, batch_size=8))


def one_path(path: str, df: Any, args: argparse.Namespace, work: Path, rows: int) -> dict[str, Any]:
    job = {
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "seed": 7,
        "step_ms": args.step_ms,
        "agree": path == "stream",
        "rows": rows,
        "features": args.features,
    }
    cache = work / "cache"
    runner = SparkRunner(np=args.np, timeout=3600)
    forked: bool | str | None = None
    start = time.time()
    if path in ("stream", "unagreed"):
        data = from_dataframe(
            df, args.batch_size, num_epochs=args.epochs, shuffle=True, seed=7, window=args.window
        )
        ranks = runner.run(rank_stream, data=data, job=job)["ranks"]
    elif path == "converter":
        converter = make_spark_converter(df, cache_dir=f"file://{cache}")
        ranks = runner.run(rank_converter, converter=converter, job=job)["ranks"]
    elif path == "distributor":
        from pyspark.ml.torch.distributor import TorchDistributor

        peer = TorchDistributor(num_processes=args.np, local_mode=False, use_gpu=False)
        # One partition per task, as it requires; each task's rank is a new torchrun process.
        parts = df.repartition(args.np)
        ranks = peer._train_on_dataframe(rank_distributor, parts, job)["ranks"]
        forked = "no (torchrun)"
    else:
        ranks = runner.run(rank_memory, job=job)["ranks"]
    end = time.time()
    result = summarize(ranks, start, end, folder_bytes(cache))
    if path == "converter":
        converter.delete()  # the next round writes its copy again
    if forked is None:
        forked = rank0_forked(runner)
        forked = "unknown" if forked is None else ("yes" if forked else "no")
    result["forked"] = forked
    check_rows(path, result["rows"], rows, args.epochs, abs(args.np) * args.batch_size)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--np", type=int, default=2, help="ranks (< 0: on the driver)")
    parser.add_argument("--partitions", type=int, default=8, help="the DataFrame's partitions")
    parser.add_argument("--window", type=int, default=2, help="from_dataframe's window")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step per batch")
    parser.add_argument("--rounds", type=int, default=1, help="times each path is measured")
    parser.add_argument(
        "--larger", type=int, default=4, help="the stream and the ceiling once more at this "
        "many times --rows, for their peak RSS at two sizes (0: not)",
    )  # fmt: skip
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--dir", default=None, help="where the private temporary folder goes")
    parser.add_argument("--quick", action="store_true", help="4,000 rows x 8, batch 64, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.features, args.batch_size, args.partitions = 4000, 8, 64, 4
        args.rounds = 1
    require(args.rows > 0 and args.features > 0 and args.batch_size > 0, "sizes must be > 0")
    require(args.epochs >= 1 and args.rounds >= 1 and args.np != 0, "--epochs, --rounds, --np")
    require(args.larger == 0 or args.larger >= 2, "--larger: 0, or 2 and more")
    missing: dict[str, str] = {}
    why = distributor_missing() if args.np > 0 else "np < 0 runs on the driver: no Spark tasks"
    if why is not None:
        missing["distributor"] = why
    paths = [path for path in PATHS if path not in missing]
    work = Path(tempfile.mkdtemp(prefix="bench-stream-", dir=args.dir))
    spark = session(args.master, args.partitions)
    spark.sparkContext.setLogLevel("ERROR")
    print(
        f"{args.rows:,} rows x {args.features} float32 features + label "
        f"({args.rows * (args.features * 4 + 8) / MIB:,.1f} MiB of values), {args.partitions} "
        f"partitions, batch {args.batch_size}, {args.epochs} epochs, shuffled, np={args.np}, "
        f"master {args.master}, window {args.window}, step {args.step_ms} ms/batch"
    )
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rounds: list[dict[str, dict]] = []
    larger: dict[str, Any] = {}
    try:
        df = frame(spark, args.rows, args.features, args.partitions)
        warm_both(spark, args.np)
        for number in range(args.rounds):
            order = paths if number % 2 == 0 else paths[::-1]
            measures: dict[str, dict] = {}
            for path in order:
                print(f"  round {number + 1}: {path}", flush=True)
                measures[path] = one_path(path, df, args, work, args.rows)
            rounds.append(measures)
        if args.larger:
            bigger = frame(spark, args.rows * args.larger, args.features, args.partitions)
            for path in LARGER_PATHS:
                print(f"  {args.larger}x the rows: {path}", flush=True)
                larger[path] = one_path(path, bigger, args, work, args.rows * args.larger)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    report(rounds, args.epochs, missing)
    if larger:
        smaller = {path: median_of(rounds, path, "peak") for path in LARGER_PATHS}
        sizes_report(smaller, larger, args.rows, args.larger)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (other work on the machine skews)")


if __name__ == "__main__":
    main()
