"""The Spark ML side from a Spark Connect session: TorchEstimator and TorchModel in a Pipeline
(fit on executors, transform, save and load) and predict_udf, against the tier's server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.ml_models import digits_frames, digits_mlp

pytestmark = pytest.mark.spark


def _scored(frame) -> tuple[list[int], list[float], np.ndarray]:
    """Labels, predictions and probabilities of the transformed rows, in the order of id."""
    rows = sorted(frame.select("id", "label", "prediction", "probability").collect())
    probabilities = np.array([row["probability"].toArray() for row in rows])
    return [row["label"] for row in rows], [row["prediction"] for row in rows], probabilities


def test_pipeline_fits_on_executors_transforms_saves_and_loads(connect, tmp_path: Path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    from sparktrain.ml import TorchEstimator, TorchModel

    train, test = digits_frames(connect, test_rows=120)
    test = test.withColumn("id", F.monotonically_increasing_id())
    assembler = VectorAssembler(inputCols=[f"p{i}" for i in range(64)], outputCol="features")
    estimator = TorchEstimator(
        modelFactory=digits_mlp, np=2, epochs=3, batchSize=64, learningRate=1e-2
    )
    fitted = Pipeline(stages=[assembler, estimator]).fit(train)

    model = fitted.stages[-1]
    assert isinstance(model, TorchModel)
    assert [h["epoch"] for h in model.history] == [0, 1, 2]
    assert model.history[-1]["loss"] < model.history[0]["loss"]
    labels, predicted, probabilities = _scored(fitted.transform(test))
    assert probabilities.shape == (120, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert predicted == list(probabilities.argmax(axis=1))
    # Three epochs of ~1,700 rows: far better than the 10% of a guess.
    assert np.mean(np.array(predicted) == np.array(labels)) >= 0.6

    path = tmp_path / "pipeline"
    fitted.write().overwrite().save(str(path))
    loaded = PipelineModel.load(str(path))
    assert isinstance(loaded.stages[-1], TorchModel)
    assert loaded.stages[-1].history == model.history
    _, again, again_probabilities = _scored(loaded.transform(test))
    assert again == predicted
    np.testing.assert_array_equal(again_probabilities, probabilities)

    # The model on its own, over the saved pipeline: overwrite() removes what was there.
    model.write().overwrite().save(str(path))
    assert not (path / "stages").exists()
    alone = TorchModel.load(str(path))
    assert alone.history == model.history
    assert alone.state is not None and model.state is not None
    assert sorted(alone.state) == sorted(model.state)
    assert all(alone.state[k].equal(model.state[k]) for k in model.state)


def test_predict_udf_scores_a_connect_dataframe(connect):
    import torch
    from pyspark.sql import functions as F

    from sparktrain.inference import predict_udf

    torch.manual_seed(3)
    model = torch.nn.Linear(4, 3)
    frame = connect.range(0, 40, 1, 2).select(
        "id", F.array(*[(F.col("id") * (k + 1) / 10).cast("float") for k in range(4)]).alias("x")
    )
    classify = predict_udf(model, task="classification", batch_size=8)
    rows = frame.select("id", classify("x").alias("out")).orderBy("id").collect()

    x = torch.tensor([[i * (k + 1) / 10 for k in range(4)] for i in range(40)])
    with torch.no_grad():
        expected = torch.softmax(model(x), dim=1).numpy()
    got = np.array([row["out"]["probability"] for row in rows])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert [row["out"]["prediction"] for row in rows] == list(expected.argmax(axis=1))
