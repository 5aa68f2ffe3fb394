"""TorchEstimator.fit refuses bad input with a clear error before any training job starts.

Each test runs ``fit`` in a job group of its own and counts the Spark jobs of that group:
none for mistakes found in the settings and the schema. Mistakes found in the rows take one
aggregation over the data (one or two jobs, as adaptive execution splits it); the data cache
directory then stays untouched, so neither the materialization nor the training started.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sparktrain import ConfigurationError, PayloadError
from tests.fixtures.ml_models import digits_mlp

pytestmark = [pytest.mark.spark]


@contextmanager
def counted_jobs(spark) -> Iterator[list[int]]:
    """The ids of the jobs started inside the block (filled in when it ends)."""
    sc = spark.sparkContext
    group = "ml-errors-" + uuid.uuid4().hex[:8]
    sc.setJobGroup(group, "TorchEstimator checks")
    jobs: list[int] = []
    try:
        yield jobs
    finally:
        jobs.extend(sc.statusTracker().getJobIdsForGroup(group))
        sc.setLocalProperty("spark.jobGroup.id", None)


def estimator(**settings):
    from sparktrain.ml import TorchEstimator

    settings.setdefault("modelFactory", digits_mlp)
    return TorchEstimator(np=2, epochs=1, **settings)


@pytest.fixture
def cache_dir(spark, tmp_path):
    """The data cache directory for this test; the test checks that fit never writes it."""
    from sparktrain.data import CACHE_DIR_CONF

    path = tmp_path / "cache"
    spark.conf.set(CACHE_DIR_CONF, f"file://{path}")
    yield path
    spark.conf.unset(CACHE_DIR_CONF)


@pytest.fixture(scope="module")
def frame(spark):
    """Four rows of 64 features (an array column) and an integer label."""
    rows = [([float(i % 7)] * 64, i % 3, f"class-{i % 3}") for i in range(4)]
    return spark.createDataFrame(rows, "features array<double>, label int, name string")


def test_a_missing_column_is_named_with_the_setting_to_change(spark, frame):
    with counted_jobs(spark) as jobs, pytest.raises(ConfigurationError) as error:
        estimator(featuresCol="pixels").fit(frame)
    assert "the features column 'pixels' is not in the DataFrame" in str(error.value)
    assert "features, label, name" in str(error.value)
    assert "set featuresCol=" in str(error.value)
    assert jobs == []


def test_a_string_label_asks_for_a_string_indexer(spark, frame):
    with counted_jobs(spark) as jobs, pytest.raises(ConfigurationError) as error:
        estimator(labelCol="name").fit(frame)
    assert "the label column 'name' is string" in str(error.value)
    assert "StringIndexer" in str(error.value)
    assert jobs == []


def test_a_string_features_column_asks_for_a_vector_assembler(spark, frame):
    with counted_jobs(spark) as jobs, pytest.raises(ConfigurationError) as error:
        estimator(featuresCol="name").fit(frame)
    assert "the features column 'name' is string" in str(error.value)
    assert "VectorAssembler" in str(error.value)
    assert jobs == []


def test_an_empty_dataframe_is_refused_before_materializing(spark, frame, cache_dir):
    with pytest.raises(ConfigurationError) as error:
        estimator().fit(frame.where("label < 0"))
    assert "the DataFrame is empty (0 rows)" in str(error.value)
    assert not cache_dir.exists()


def test_features_of_inconsistent_length_are_refused(spark, cache_dir):
    rows = [([1.0, 2.0, 3.0], 0), ([1.0, 2.0, 3.0, 4.0], 1)]
    frame = spark.createDataFrame(rows, "features array<double>, label int")
    with pytest.raises(ConfigurationError) as error:
        estimator().fit(frame)
    assert "features of inconsistent length: rows have from 3 to 4 values" in str(error.value)
    assert not cache_dir.exists()


def test_a_model_that_does_not_take_the_features_is_refused(spark, cache_dir):
    frame = spark.createDataFrame([([1.0] * 5, 0)], "features array<double>, label int")
    with pytest.raises(ConfigurationError) as error:
        estimator().fit(frame)
    message = str(error.value)
    assert "the model fails on a batch of shape (2, 5)" in message
    assert "set inputShape=" in message
    assert not cache_dir.exists()


def test_labels_beyond_the_models_outputs_are_refused(spark):
    frame = spark.createDataFrame([([1.0] * 64, 12)], "features array<double>, label int")
    with pytest.raises(ConfigurationError) as error:
        estimator().fit(frame)
    assert "the model gives 10 outputs per row, but the labels go up to 12" in str(error.value)


def test_a_model_factory_that_cannot_be_pickled_names_the_captured_object(spark, frame):
    lock = threading.Lock()

    def build():
        with lock:
            return digits_mlp()

    with counted_jobs(spark) as jobs, pytest.raises(PayloadError) as error:
        estimator(modelFactory=build).fit(frame)
    assert "the variable 'lock' captured by build()" in str(error.value)
    assert jobs == []


def test_a_missing_model_factory_is_refused(spark, frame):
    with counted_jobs(spark) as jobs, pytest.raises(ConfigurationError) as error:
        estimator(modelFactory=None).fit(frame)
    assert "TorchEstimator needs modelFactory=" in str(error.value)
    assert jobs == []
