"""TorchEstimator and TorchModel in a Spark ML Pipeline: fit on the digits, transform, save, load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.ml_models import digits_frames, digits_mlp

pytestmark = [pytest.mark.spark]


def accuracy(rows: list) -> float:
    return float(np.mean([row["prediction"] == row["label"] for row in rows]))


def test_pipeline_fits_the_digits_transforms_saves_and_loads(spark, tmp_path: Path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparktrain.ml import TorchEstimator, TorchModel

    train, test = digits_frames(spark)
    assembler = VectorAssembler(inputCols=[f"p{i}" for i in range(64)], outputCol="features")
    estimator = TorchEstimator(
        modelFactory=digits_mlp,
        np=2,
        epochs=15,
        batchSize=32,
        learningRate=3e-3,
        validationFraction=0.1,
    )
    fitted = Pipeline(stages=[assembler, estimator]).fit(train)

    model = fitted.stages[-1]
    assert isinstance(model, TorchModel)
    assert [h["epoch"] for h in model.history] == list(range(15))
    assert model.history[-1]["loss"] < model.history[0]["loss"]
    assert 0.0 <= model.history[-1]["val_accuracy"] <= 1.0

    scored = fitted.transform(test).select("label", "prediction", "probability").collect()
    assert len(scored) == 360
    assert accuracy(scored) >= 0.95, accuracy(scored)
    probabilities = np.array([row["probability"].toArray() for row in scored])
    assert probabilities.shape == (360, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert [row["prediction"] for row in scored] == list(probabilities.argmax(axis=1))

    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    assert isinstance(loaded.stages[-1], TorchModel)
    assert loaded.stages[-1].history == model.history
    again = loaded.transform(test).select("label", "prediction", "probability").collect()
    assert [row["prediction"] for row in again] == [row["prediction"] for row in scored]
    np.testing.assert_array_equal(
        np.array([row["probability"].toArray() for row in again]), probabilities
    )


def test_predict_udf_from_a_checkpoint_builds_once_per_worker_and_never_goes_row_by_row(
    spark, tmp_path: Path, monkeypatch
):
    import os

    import torch
    from pyspark.sql import functions as F

    from sparktrain.checkpoint import save
    from sparktrain.inference import predict_udf
    from tests.fixtures.ml_models import recording_factory

    records = tmp_path / "records"
    records.mkdir()
    factory = recording_factory(str(records))
    trained = factory()
    with torch.no_grad():
        trained.linear.weight.mul_(3.0)  # weights that differ from the factory's own
    monkeypatch.setenv("RANK", "0")
    save({"model": trained.state_dict()}, str(tmp_path / "ckpt"), step=1)
    for stale in records.iterdir():  # the driver's own builds and passes
        stale.unlink()

    frame = spark.range(0, 200, 1, 4).select(
        F.col("id"), F.array(*[(F.col("id") * (k + 1) / 100).cast("float") for k in range(4)])
    )
    frame = frame.toDF("id", "x")
    run = predict_udf(factory, checkpoint=str(tmp_path / "ckpt"), batch_size=8)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
    try:
        # Sorted here: orderBy would run the UDF once more, to sample the sort's ranges.
        first = sorted(frame.select("id", run("x").alias("out")).collect())
        second = sorted(frame.select("id", run("x").alias("out")).collect())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    x = torch.tensor([[i * (k + 1) / 100 for k in range(4)] for i in range(200)])
    with torch.no_grad():
        expected = trained.linear(x).numpy()
    np.testing.assert_allclose(np.array([r["out"] for r in first]), expected, rtol=1e-5)
    assert [r["out"] for r in second] == [r["out"] for r in first]

    workers = {p.name.split("-")[1] for p in records.iterdir()} - {str(os.getpid())}
    assert workers, "no Python worker recorded anything"
    for pid in workers:
        # Two jobs, several tasks and batches each: one build per Python worker.
        assert (records / f"builds-{pid}").read_text().count("built") == 1
    sizes = [int(s) for pid in workers for s in (records / f"batches-{pid}").read_text().split()]
    # Each partition of 50 rows arrives as Arrow batches of 16, 16, 16, 2 rows, each cut
    # into forward passes of at most 8 rows: 7 passes per partition and job.
    assert sum(sizes) == 2 * 200
    assert sorted(set(sizes)) == [2, 8]
    assert len(sizes) == 2 * 4 * 7


@pytest.mark.horovod
def test_a_regressor_trains_with_horovod_on_the_driver_and_checkpoints(spark, tmp_path: Path):
    import importlib.util

    if importlib.util.find_spec("horovod") is None:
        pytest.skip("Horovod is not installed: build it with scripts/install-horovod.sh")
    import torch

    from sparktrain.checkpoint import load_latest
    from sparktrain.ml import TorchEstimator

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.25
    frame = spark.createDataFrame(
        [(row.tolist(), float(target)) for row, target in zip(x, y, strict=True)],
        "features array<double>, label double",
    )
    estimator = TorchEstimator(
        modelFactory=lambda: torch.nn.Linear(3, 1),
        loss="mse",
        np=-2,
        backend="horovod",
        epochs=30,
        batchSize=16,
        learningRate=0.05,
        checkpointDir=str(tmp_path / "ckpt"),
    )
    model = estimator.fit(frame)
    assert model.getOrDefault("task") == "regression"
    assert model.history[-1]["loss"] < 0.01 < model.history[0]["loss"]
    assert load_latest(str(tmp_path / "ckpt")).step == 29

    scored = model.transform(frame.limit(20)).collect()
    assert "probability" not in scored[0].asDict()
    error = max(abs(row["prediction"] - row["label"]) for row in scored)
    assert error < 0.3, error


def test_an_estimator_that_streams_its_rows_learns_and_writes_no_copy(spark, tmp_path: Path):
    """dataSource='stream': the fit's stage runs over the training DataFrame; no cache."""
    from pyspark.ml.feature import VectorAssembler

    from sparktrain.data import CACHE_DIR_CONF
    from sparktrain.ml import TorchEstimator

    train, test = digits_frames(spark)
    assembler = VectorAssembler(inputCols=[f"p{i}" for i in range(64)], outputCol="features")
    cache = tmp_path / "cache"
    cache.mkdir()
    before = spark.conf.get(CACHE_DIR_CONF, None)
    spark.conf.set(CACHE_DIR_CONF, f"file://{cache}")
    try:
        estimator = TorchEstimator(
            modelFactory=digits_mlp,
            np=2,
            epochs=12,
            batchSize=32,
            learningRate=3e-3,
            dataSource="stream",
        )
        model = estimator.fit(assembler.transform(train))
    finally:
        if before is None:
            spark.conf.unset(CACHE_DIR_CONF)
        else:
            spark.conf.set(CACHE_DIR_CONF, before)
    assert [h["epoch"] for h in model.history] == list(range(12))
    assert model.history[-1]["loss"] < model.history[0]["loss"] / 2
    scored = model.transform(assembler.transform(test)).select("label", "prediction").collect()
    assert accuracy(scored) >= 0.9, accuracy(scored)
    assert list(cache.iterdir()) == []
    from sparktrain.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="dataSource must be one of cache, stream; got"):
        estimator.setParams(dataSource="disk").fit(assembler.transform(train))
