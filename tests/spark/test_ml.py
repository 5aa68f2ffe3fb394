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
