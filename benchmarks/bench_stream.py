"""Training straight from a DataFrame (``from_dataframe``) against the converter's Parquet copy,
TorchDistributor's private ``_train_on_dataframe`` and rows already in memory (the ceiling).

One generated DataFrame (``--rows`` rows of ``--features`` float32 features in an array column
and an integer label, computed by Spark from ``spark.range``) is read by ``--np`` ranks on an
embedded Spark session (``--master``, by default ``local-cluster[2,1,1024]``: two executor
JVMs) in six ways, through the calls users make:

* **stream**: ``SparkRunner(np).run(train, data=from_dataframe(df, batch_size, num_epochs))``:
  the run's barrier stage runs over ``df.repartition(np)`` and each task streams its
  partition's Arrow batches to its ranks; epochs after the first read each rank's local spill;
* **stream, own partitions**: the same with ``from_dataframe(..., repartition=False)`` over the
  same rows generated in exactly ``np`` partitions (``spark.range(rows, numPartitions=np)``):
  the stage runs over the DataFrame's own partitions, no shuffle, so each task streams its
  partition while Spark computes it;
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
stream / TorchDistributor, stream / in memory, own partitions / converter, own partitions /
TorchDistributor, and no step agreement / converter. With
``--larger K`` (default 4) the stream and the ceiling run once more on a DataFrame of K times
the rows, and a last table sets their peak RSS per rank at the two sizes side by side.
Each path's row counts are checked before a ratio is printed: the converter reads every row in
each epoch (its shards padded to equal size), the stream every row but those the equal-steps
rule leaves out (fewer than ``np * batch_size``), the same in every epoch (so does the stream
over its own partitions, which ``spark.range`` makes equal), TorchDistributor
``np * (rows // np)`` each epoch, and without the agreement and in memory every row;
otherwise the benchmark stops with exit status 1. Two warm-up runs first start the executors'
Python workers of both kinds of stage (over tasks, and over a DataFrame: ``mapInArrow``'s
workers are others), so every path is measured warm (TorchDistributor's ranks are new torchrun
processes on every call); each row says whether rank 0 was forked from a zygote
(``--no-warm-up`` leaves them out: the first path of each kind then starts those workers). With
``--rounds`` above 1 the paths take turns at going first and the ratios are medians over the
rounds. Times are printed, never asserted. Files go to a private temporary folder under
``--dir`` (default: the system's), removed at the end. Progress lines print when each step
began, in seconds from the session's start (where a run's seconds go).

Its parts: ``bench_stream_paths.py`` (the session, the DataFrame, each path's calls),
``bench_stream_ranks.py`` (what the ranks run), ``bench_stream_report.py`` (measures, checks,
tables). ``main(argv, spark=session)`` measures on a session it is given, and leaves it running.

    .venv/bin/python benchmarks/bench_stream.py                       # 200k rows x 64, np=2
    .venv/bin/python benchmarks/bench_stream.py --rows 1000000 --rounds 3
    .venv/bin/python benchmarks/bench_stream.py --quick   # 4,000 rows x 8, no warm-up runs
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_stream_paths import distributor_missing, frame, one_path, session, warm_both
from bench_stream_report import LARGER_PATHS, MIB, PATHS, median_of, report, sizes_report
from instruments import require


def main(argv: list[str] | None = None, spark: Any = None) -> None:
    """Parse ``argv`` (default: the command line), measure, print the tables.

    ``spark``: a session to measure on (left running at the end); by default one of its own on
    ``--master``, stopped at the end.
    """
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
    parser.add_argument(
        "--warm-up", action=argparse.BooleanOptionalAction, default=True,
        help="the two warm-up runs first, so that every path is measured warm",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help="4,000 rows x 8, batch 64, 1 round, no warm-up runs: a check that it runs",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.features, args.batch_size, args.partitions = 4000, 8, 64, 4
        args.rounds, args.warm_up = 1, False
    require(args.rows > 0 and args.features > 0 and args.batch_size > 0, "sizes must be > 0")
    require(args.epochs >= 1 and args.rounds >= 1 and args.np != 0, "--epochs, --rounds, --np")
    require(args.larger == 0 or args.larger >= 2, "--larger: 0, or 2 and more")
    missing: dict[str, str] = {}
    why = distributor_missing() if args.np > 0 else "np < 0 runs on the driver: no Spark tasks"
    if why is not None:
        missing["distributor"] = why
    paths = [path for path in PATHS if path not in missing]
    began = time.time()

    def progress(what: str) -> None:
        print(f"  [{time.time() - began:6.1f} s] {what}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench-stream-", dir=args.dir))
    own_session = spark is None
    if own_session:
        spark = session(args.master, args.partitions)
        spark.sparkContext.setLogLevel("ERROR")
    else:
        args.master = spark.sparkContext.master
    print(
        f"{args.rows:,} rows x {args.features} float32 features + label "
        f"({args.rows * (args.features * 4 + 8) / MIB:,.1f} MiB of values), {args.partitions} "
        f"partitions, batch {args.batch_size}, {args.epochs} epochs, shuffled, np={args.np}, "
        f"master {args.master}, window {args.window}, step {args.step_ms} ms/batch"
    )
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rounds: list[dict[str, dict]] = []
    larger: dict[str, Any] = {}
    progress("Spark session up")
    try:
        frames = {
            "repartitioned": frame(spark, args.rows, args.features, args.partitions),
            "own": frame(spark, args.rows, args.features, abs(args.np)),
        }
        if args.warm_up:
            warm_both(spark, args.np, progress)
        for number in range(args.rounds):
            order = paths if number % 2 == 0 else paths[::-1]
            measures: dict[str, dict] = {}
            for path in order:
                progress(f"round {number + 1}: {path}")
                measures[path] = one_path(path, frames, args, work, args.rows)
            rounds.append(measures)
        if args.larger:
            bigger = {"repartitioned": frame(spark, args.rows * args.larger, args.features,
                                             args.partitions)}  # fmt: skip
            for path in LARGER_PATHS:
                progress(f"{args.larger}x the rows: {path}")
                larger[path] = one_path(path, bigger, args, work, args.rows * args.larger)
        progress("done")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own_session:
            spark.stop()
    report(rounds, args.epochs, missing)
    if larger:
        smaller = {path: median_of(rounds, path, "peak") for path in LARGER_PATHS}
        sizes_report(smaller, larger, args.rows, args.larger)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (other work on the machine skews)")


if __name__ == "__main__":
    main()
