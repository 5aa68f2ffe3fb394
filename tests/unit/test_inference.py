"""The executor side of batched inference, without Spark: Arrow in, model once, Arrow out."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparktrain import ConfigurationError, PayloadError
from sparktrain.checkpoint import save
from sparktrain.inference import predictor
from sparktrain.inference.udf import load_weights, model_spec


def linear(width: int = 4, outputs: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(width, outputs)


def rows(matrix: np.ndarray) -> pa.Array:
    return pa.array([list(row) for row in matrix], type=pa.list_(pa.float32()))


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(predictor, "_MODELS", predictor.collections.OrderedDict())


def test_features_come_out_as_one_matrix_without_a_copy_per_row():
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4)
    array = rows(matrix)
    np.testing.assert_array_equal(predictor.features_matrix(array), matrix)
    np.testing.assert_array_equal(predictor.features_matrix(array.slice(1, 2)), matrix[1:])
    chunked = pa.chunked_array([array.slice(0, 1), array.slice(1, 2)])
    np.testing.assert_array_equal(predictor.features_matrix(chunked), matrix)


def test_rows_of_different_lengths_are_an_error_naming_both():
    array = pa.array([[1.0, 2.0], [1.0, 2.0, 3.0]], type=pa.list_(pa.float32()))
    with pytest.raises(ConfigurationError, match="rows of 2 and of 3 values"):
        predictor.features_matrix(array)


def test_a_null_row_is_an_error_saying_where():
    array = pa.array([[1.0], None, [2.0]], type=pa.list_(pa.float32()))
    with pytest.raises(ConfigurationError, match="the first at row 1 of the batch"):
        predictor.features_matrix(array)


def test_a_column_that_is_not_arrays_points_to_vector_to_array():
    with pytest.raises(ConfigurationError, match="vector_to_array"):
        predictor.features_matrix(pa.array([1.0, 2.0]))


def test_classification_gives_argmax_and_softmax_like_torch():
    model = linear()
    spec = model_spec(model, task="classification", batch_size=2)
    matrix = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    (out,) = predictor.predict_arrow(spec, iter([rows(matrix)]))
    expected = torch.softmax(model(torch.from_numpy(matrix)), dim=1).detach().numpy()
    probability = np.array(out.field("probability").to_pylist())
    np.testing.assert_allclose(probability, expected, rtol=1e-5)
    assert out.field("prediction").to_pylist() == list(expected.argmax(axis=1).astype(float))
    assert out.type == pa.struct(
        [("prediction", pa.float64()), ("probability", pa.list_(pa.float64()))]
    )


def test_log_probabilities_are_exponentiated_not_softmaxed():
    model = torch.nn.Sequential(linear(), torch.nn.LogSoftmax(dim=1))
    spec = model_spec(model, task="classification", log_probabilities=True)
    matrix = np.ones((2, 4), dtype=np.float32)
    (out,) = predictor.predict_arrow(spec, iter([rows(matrix)]))
    expected = model(torch.from_numpy(matrix)).exp().detach().numpy()
    np.testing.assert_allclose(np.array(out.field("probability").to_pylist()), expected, 1e-5)


def test_regression_needs_one_output_per_row():
    spec = model_spec(linear(4, 1), task="regression")
    (out,) = predictor.predict_arrow(spec, iter([rows(np.ones((3, 4), np.float32))]))
    assert out.type == pa.float64() and len(out) == 3
    wide = model_spec(linear(4, 3), task="regression")
    with pytest.raises(ConfigurationError, match="the model gives 3"):
        list(predictor.predict_arrow(wide, iter([rows(np.ones((3, 4), np.float32))])))


def test_input_shape_reshapes_each_row_for_the_model():
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten())
    spec = model_spec(conv, task="raw", input_shape=(1, 4, 4))
    matrix = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    (out,) = predictor.predict_arrow(spec, iter([rows(matrix)]))
    expected = conv(torch.from_numpy(matrix).reshape(3, 1, 4, 4)).detach().numpy()
    np.testing.assert_allclose(np.array(out.to_pylist()), expected, rtol=1e-5)


def test_the_model_is_built_once_per_process_and_fed_whole_batches(tmp_path):
    from tests.fixtures.ml_models import recording_factory

    spec = model_spec(recording_factory(str(tmp_path)), task="raw", batch_size=4)
    batches = [rows(np.ones((10, 4), np.float32)), rows(np.ones((3, 4), np.float32))]
    builds_on_driver = len(list(tmp_path.glob("builds-*")))
    for _task in range(3):  # three tasks in one Python worker
        assert [len(out) for out in predictor.predict_arrow(spec, iter(batches))] == [10, 3]
    (builds,) = tmp_path.glob("builds-*")
    # model_spec built it once on the driver to check it; the worker built it once more.
    assert builds_on_driver == 1
    assert builds.read_text().count("built") == 2
    (sizes,) = tmp_path.glob("batches-*")
    assert sizes.read_text().split() == ["4", "4", "2", "3"] * 3


def test_the_task_gpu_is_used_when_spark_gave_one(monkeypatch):
    import pyspark

    gpus = SimpleNamespace(addresses=["1"])
    context = SimpleNamespace(resources=lambda: {"gpu": gpus})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: context))
    assert predictor.task_device("auto") == "cuda:1"
    assert predictor.task_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert predictor.task_device("auto") == "cpu"
    with pytest.raises(ConfigurationError, match="torch sees no GPU"):
        predictor.task_device("cuda")


def test_weights_come_from_the_newest_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    trained = linear()
    save({"model": trained.state_dict(), "epoch": 3}, str(tmp_path), step=3)
    state = load_weights(str(tmp_path), "model", None)
    assert state is not None
    assert torch.equal(state["weight"], trained.weight)
    with pytest.raises(ConfigurationError, match="holds no 'net' entry"):
        load_weights(str(tmp_path), "net", None)
    with pytest.raises(ConfigurationError, match="no committed checkpoint"):
        load_weights(str(tmp_path / "none"), "model", None)


def test_weights_that_do_not_fit_the_model_are_refused_on_the_driver():
    with pytest.raises(ConfigurationError, match="does not take the checkpoint's weights"):
        model_spec(lambda: linear(5), state=linear(4).state_dict())


def test_bad_options_are_refused():
    with pytest.raises(ConfigurationError, match="task must be one of"):
        model_spec(linear(), task="segmentation")
    with pytest.raises(ConfigurationError, match="batch_size must be a positive int"):
        model_spec(linear(), batch_size=0)
    with pytest.raises(ConfigurationError, match="a function that builds one"):
        model_spec("resnet")
    with pytest.raises(ConfigurationError, match="must return a torch.nn.Module"):
        model_spec(lambda: "resnet")


def test_a_factory_that_cannot_be_pickled_names_what_it_captured():
    lock = threading.Lock()

    def build():
        with lock:
            return linear()

    with pytest.raises(PayloadError, match="the variable 'lock' captured by build"):
        model_spec(build)


def test_the_pandas_udf_for_older_pyspark_gives_the_same_results():
    import pandas as pd

    from sparktrain.inference.udf import pandas_predict

    model = linear()
    spec = model_spec(model, task="classification")
    matrix = np.random.default_rng(2).normal(size=(4, 4)).astype(np.float32)
    (frame,) = pandas_predict(spec)(iter([pd.Series(list(matrix))]))
    expected = torch.softmax(model(torch.from_numpy(matrix)), dim=1).detach().numpy()
    assert list(frame.columns) == ["prediction", "probability"]
    np.testing.assert_allclose(np.stack(frame["probability"].to_list()), expected, rtol=1e-5)
    assert frame["prediction"].to_list() == list(expected.argmax(axis=1).astype(float))
