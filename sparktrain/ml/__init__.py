"""Spark ML stages for torch: train in a ``Pipeline``, transform in batches on executors.

Example:
    >>> from pyspark.ml import Pipeline
    >>> from pyspark.ml.feature import VectorAssembler
    >>> from sparktrain.ml import TorchEstimator, TorchModel
    >>> pipeline = Pipeline(stages=[
    ...     VectorAssembler(inputCols=columns, outputCol="features"),
    ...     TorchEstimator(modelFactory=build_net, np=2, epochs=10),
    ... ])
    >>> fitted = pipeline.fit(train_df)
    >>> fitted.transform(test_df).select("label", "prediction", "probability")
    >>> fitted.write().overwrite().save("/models/digits")

This package imports pyspark; the training loop it runs on the ranks
(:mod:`sparktrain.ml.train`) does not.
"""

from sparktrain.ml.estimator import TorchEstimator
from sparktrain.ml.model import TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
