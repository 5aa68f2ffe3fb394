"""``bench_stream.py``'s Spark side: its session, the generated DataFrame, the warm-up runs and
one measured call of each path (the ranks' side is ``bench_stream_ranks.py``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import bench_stream_ranks as ranks_code
import cloudpickle
from bench_stream_report import check_rows, folder_bytes, summarize
from instruments import rank0_forked
from pyspark import cloudpickle as pyspark_cloudpickle

from sparktrain import SparkRunner
from sparktrain.data import from_dataframe, make_spark_converter

# The ranks (SparkRunner's and TorchDistributor's) need not import benchmarks/.
cloudpickle.register_pickle_by_value(ranks_code)
pyspark_cloudpickle.register_pickle_by_value(ranks_code)


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
    """``rows`` rows in ``partitions`` partitions of equal size (``spark.range``'s):
    ``features`` (array<float>, uniform in [0, 1)) and ``label`` (0-9)."""
    from pyspark.sql import functions as F

    values = [F.rand(seed=column) for column in range(features)]
    return spark.range(rows, numPartitions=partitions).select(
        F.array(*values).cast("array<float>").alias("features"),
        (F.col("id") % 10).cast("long").alias("label"),
    )


def warm_both(spark: Any, np: int, progress: Any) -> None:
    """Warm-up runs of both kinds of stage: a stage over tasks (the converter's runs), and one
    over a DataFrame (``mapInArrow``, whose Python workers are others); ``progress(what)``
    before each."""
    progress("warm-up run: a stage over tasks")
    SparkRunner(np=np, timeout=3600).run(ranks_code.warm_up)
    progress("warm-up run: a stage over a DataFrame")
    tiny = spark.range(64).selectExpr("id AS label")
    data = from_dataframe(tiny, batch_size=8)
    SparkRunner(np=np, timeout=3600).run(ranks_code.warm_up, data=data)


def call(path: str, frames: dict[str, Any], args: argparse.Namespace, job: dict, cache: Path):
    """The path's own calls; its ranks' results, the runner (None: not sparktrain's) and the
    converter to delete (None: none)."""
    runner = SparkRunner(np=args.np, timeout=3600)
    df = frames[path] if path in frames else frames["repartitioned"]
    if path in ("stream", "own", "unagreed"):
        data = from_dataframe(
            df, args.batch_size, num_epochs=args.epochs, shuffle=True, seed=7,
            window=args.window, repartition=path != "own",
        )  # fmt: skip
        return runner.run(ranks_code.rank_stream, data=data, job=job)["ranks"], runner, None
    if path == "converter":
        converter = make_spark_converter(df, cache_dir=f"file://{cache}")
        ranks = runner.run(ranks_code.rank_converter, converter=converter, job=job)["ranks"]
        return ranks, runner, converter
    if path == "distributor":
        from pyspark.ml.torch.distributor import TorchDistributor

        peer = TorchDistributor(num_processes=args.np, local_mode=False, use_gpu=False)
        # One partition per task, as it requires; each task's rank is a new torchrun process.
        parts = df.repartition(args.np)
        ranks = peer._train_on_dataframe(ranks_code.rank_distributor, parts, job)["ranks"]
        return ranks, None, None
    return runner.run(ranks_code.rank_memory, job=job)["ranks"], runner, None


def one_path(
    path: str, frames: dict[str, Any], args: argparse.Namespace, work: Path, rows: int
) -> dict[str, Any]:
    """One measured call of ``path`` over ``rows`` rows: its measures, rows checked.

    ``frames``: the DataFrame every path reads (``"repartitioned"``), and ``"own"``: the same
    rows in exactly ``np`` partitions, which the own-partitions stream reads."""
    job = {
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "seed": 7,
        "step_ms": args.step_ms,
        "agree": path in ("stream", "own"),
        "rows": rows,
        "features": args.features,
    }
    cache = work / "cache"
    start = time.time()
    ranks, runner, converter = call(path, frames, args, job, cache)
    end = time.time()
    result = summarize(ranks, start, end, folder_bytes(cache))
    if converter is not None:
        converter.delete()  # the next round writes its copy again
    if runner is None:
        result["forked"] = "no (torchrun)"
    else:
        forked = rank0_forked(runner)
        result["forked"] = "unknown" if forked is None else ("yes" if forked else "no")
    check_rows(path, result["rows"], rows, args.epochs, abs(args.np) * args.batch_size)
    return result
