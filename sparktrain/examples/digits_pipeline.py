"""From a DataFrame to a model and back: a Spark ML Pipeline that trains a torch model.

    python -m sparktrain.examples.digits_pipeline            # 2 ranks on Spark executors
    python -m sparktrain.examples.digits_pipeline --local    # 2 ranks on the driver

The bundled digits become a DataFrame of 64 pixel columns and a label. A ``Pipeline`` of a
``VectorAssembler`` and a :class:`~sparktrain.ml.TorchEstimator` is fitted on 1437 of them
(DDP on two ranks), the fitted pipeline scores the 360 held-out digits in batches on the
executors, and is saved, loaded and scored again.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from sparktrain import private_dir
from sparktrain.examples import _common

PIXELS = [f"p{i}" for i in range(64)]
TEST_ROWS = 360


def build_mlp() -> Any:
    """The model: 64 pixels -> 64 hidden units -> 10 logits."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def digits_frames(spark: Any) -> tuple[Any, Any]:
    """``(train, test)`` DataFrames: pixel columns p0..p63 scaled to [0, 1], and ``label``."""
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    rows = [(*map(float, data.data[i] / 16.0), int(data.target[i])) for i in order]
    columns = [*PIXELS, "label"]
    return (
        spark.createDataFrame(rows[TEST_ROWS:], columns),
        spark.createDataFrame(rows[:TEST_ROWS], columns),
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Fit, score, save, load and score again; returns the accuracies and the history."""
    parser = _common.make_parser(
        "digits_pipeline",
        "A Spark ML Pipeline (VectorAssembler + TorchEstimator) on the bundled digits.",
        np=2,
        epochs=15,
        batch_size=32,
        lr=3e-3,
        data=False,
        checkpoints=False,
    )
    parser.add_argument("--out-dir", default=None, help="where the fitted pipeline is saved")
    args = _common.parse(parser, argv)
    _common.require(args, "sklearn", "pyspark")  # the data are Spark DataFrames, whatever --np says
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparktrain.ml import TorchEstimator

    spark, created = _common.spark_session(args.master)
    print(f"Ranks: {_common.where(args.np)}", flush=True)
    try:
        train, test = digits_frames(spark)
        pipeline = Pipeline(
            stages=[
                VectorAssembler(inputCols=PIXELS, outputCol="features"),
                TorchEstimator(
                    modelFactory=build_mlp,
                    np=args.np,
                    epochs=args.epochs,
                    batchSize=args.batch_size,
                    learningRate=args.lr,
                    validationFraction=0.1,
                ),
            ]
        )
        began = time.monotonic()
        fitted = pipeline.fit(train)
        fit_seconds = time.monotonic() - began
        model: Any = fitted.stages[-1]
        history = model.history
        _common.print_table(
            history,
            [
                ("epoch", "epoch", "d"),
                ("loss", "loss", ".4f"),
                ("val_loss", "val loss", ".4f"),
                ("val_accuracy", "val accuracy", ".4f"),
            ],
        )

        def score(model: Any) -> list[float]:
            rows = model.transform(test).select("label", "prediction").collect()
            return [float(r["prediction"] == r["label"]) for r in rows]

        hits = score(fitted)
        accuracy = sum(hits) / len(hits)
        out_dir = args.out_dir or tempfile.mkdtemp(prefix="pipeline-", dir=private_dir.root())
        path = os.path.join(out_dir, "digits-pipeline")
        fitted.write().overwrite().save(path)
        loaded = PipelineModel.load(path)
        same = score(loaded) == hits
        print(
            f"fitted in {fit_seconds:.1f} s; held-out accuracy {accuracy:.4f} on {len(hits)} "
            f"digits; saved to {path}; loaded model predicts the same: {same}",
            flush=True,
        )
    finally:
        if created:
            spark.stop()
    return {"accuracy": accuracy, "same_after_load": same, "history": history, "path": path}


if __name__ == "__main__":
    main()
