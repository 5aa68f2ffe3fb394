"""Batched inference: TorchModel.transform against a hand-written predict_batch_udf.

Both score the same DataFrame (cached in executor memory, an ``array<float>`` features
column) with the same torch model, returning a prediction (argmax) and the class
probabilities (softmax), with the same batch size. Each round runs both, in alternating
order, writing to Spark's ``noop`` sink so that every row is computed and nothing is
collected. The table shows rows per second and the ratio to the peer measured in the same
run; no time is asserted.

Before anything is timed, both outputs are compared on every row (joined on a row id): the
same number of rows, the same prediction for each, and probabilities within 1e-5. If they
differ the benchmark stops with exit status 1 and prints no ratio: the timed plans are the
ones compared. State: warm. Round 0 (the first use of each in the session: Python workers
start, the model is unpickled) is run and left out; the medians are of later rounds. No rank
is launched here, so no zygote is involved.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_inference.py [--rows 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from instruments import require

FEATURES = 64
CLASSES = 10


def build_model() -> Any:
    """An MLP of 64 -> 256 -> 256 -> 10: enough work per row for the forward pass to count."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, CLASSES),
    )


def peer_udf(state: dict[str, Any], batch_size: int) -> Any:
    """pyspark.ml.functions.predict_batch_udf, written as its documentation shows."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    def make_predict_fn() -> Any:
        import numpy as np
        import torch

        model = build_model()
        model.load_state_dict(state)
        model.eval()

        def predict(inputs: np.ndarray) -> dict[str, np.ndarray]:
            with torch.inference_mode():
                logits = model(torch.from_numpy(inputs.astype(np.float32)))
                probability = torch.softmax(logits, dim=1).double().numpy()
            return {
                "prediction": probability.argmax(axis=1).astype(np.float64),
                "probability": probability,
            }

        return predict

    return_type = StructType(
        [
            StructField("prediction", DoubleType()),
            StructField("probability", ArrayType(DoubleType())),
        ]
    )
    return predict_batch_udf(
        make_predict_fn,
        return_type=return_type,
        batch_size=batch_size,
        input_tensor_shapes=[[FEATURES]],
    )


def agreement(mine: Any, theirs: Any, rows: int, tolerance: float = 1e-5) -> None:
    """Stop the benchmark unless both outputs hold every row with the same prediction and
    probabilities within ``tolerance``."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    joined = mine.select(
        "id", F.col("prediction").alias("p1"), vector_to_array("probability").alias("q1")
    ).join(
        theirs.select("id", F.col("prediction").alias("p2"), F.col("probability").alias("q2")),
        "id",
    )
    gap = F.array_max(F.zip_with("q1", "q2", lambda a, b: F.abs(a - b)))
    stats = joined.select(
        F.count("*").alias("rows"),
        F.sum((F.col("p1") != F.col("p2")).cast("long")).alias("differ"),
        F.max(gap).alias("gap"),
    ).first()
    counts = (mine.count(), theirs.count())
    gap = float("nan") if stats["gap"] is None else float(stats["gap"])  # None: no row matched
    print(
        f"outputs: {counts[0]} and {counts[1]} rows, {stats['rows']} matched by id, "
        f"{stats['differ']} predictions differ, largest probability gap {gap:.2e}",
        flush=True,
    )
    require(
        counts == (rows, rows) and stats["rows"] == rows,
        f"the two predictors returned {counts} rows ({stats['rows']} matched), not {rows} each",
    )
    require(stats["differ"] == 0, f"{stats['differ']} of {rows} predictions differ")
    require(gap <= tolerance, f"probabilities differ by up to {gap:.2e}, more than {tolerance:g}")


def timed(action: Any) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from sparktrain.examples import spark_session
    from sparktrain.ml import TorchModel

    spark, created = spark_session(args.master, app_name="sparktrain-bench-inference")
    try:
        model = build_model()
        state = {k: v.clone() for k, v in model.state_dict().items()}
        ours = TorchModel(build_model, state)
        ours._set(task="classification", inferenceBatchSize=args.batch_size)
        peer = peer_udf(state, args.batch_size)

        # Generated features, made on the executors and cached there.
        data = (
            spark.range(0, args.rows, 1, args.partitions)
            .select(
                "id",
                F.array(*[F.rand(seed=i).cast("float") for i in range(FEATURES)]).alias("features"),
            )
            .cache()
        )
        print(
            f"{data.count()} rows of {FEATURES} features in {args.partitions} partitions, "
            f"batch size {args.batch_size}, master {spark.sparkContext.master}",
            flush=True,
        )

        def run_ours() -> Any:
            return ours.transform(data).select("id", "prediction", "probability")

        def run_peer() -> Any:
            out = data.withColumn("out", peer("features"))
            return out.select("id", "out.prediction", "out.probability")

        agreement(run_ours(), run_peer(), args.rows)

        def sink(frame: Any) -> None:
            frame.write.format("noop").mode("overwrite").save()

        times: dict[str, list[float]] = {"TorchModel.transform": [], "predict_batch_udf": []}
        for round_ in range(args.rounds + 1):  # round 0 warms Python workers and caches
            order = [("TorchModel.transform", run_ours), ("predict_batch_udf", run_peer)]
            if round_ % 2:
                order.reverse()
            for name, make in order:
                seconds = timed(lambda make=make: sink(make()))
                if round_:
                    times[name].append(seconds)
    finally:
        if created:
            spark.stop()

    peer_rate = args.rows / statistics.median(times["predict_batch_udf"])
    results = []
    print(
        f"\nwarm: median of {args.rounds} rounds after round 0, outputs agreed on every row; "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())} (1/5/15 min)"
    )
    print(f"{'method':<22} {'median s':>9} {'rows/s':>10} {'vs peer':>8}   each round (s)")
    for name, values in times.items():
        rate = args.rows / statistics.median(values)
        results.append({"method": name, "rows_per_s": rate, "ratio": rate / peer_rate})
        rounds = " ".join(f"{v:.2f}" for v in values)
        print(
            f"{name:<22} {statistics.median(values):>9.2f} {rate:>10.0f} "
            f"{rate / peer_rate:>7.2f}x   {rounds}"
        )
    return results


if __name__ == "__main__":
    main()
