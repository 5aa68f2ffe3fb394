"""Spark DataFrame -> Parquet cache -> per-rank torch batches (petastorm's converter API).

Example:
    >>> from sparktrain.data import make_spark_converter
    >>> converter = make_spark_converter(df)           # on the driver
    >>> def train(converter):                          # on each rank
    ...     with converter.make_torch_dataloader(batch_size=64) as loader:
    ...         for batch in loader:
    ...             ...
    >>> SparkRunner(np=2).run(train, converter=converter)

The driver side (``make_spark_converter``) imports pyspark only when called; the worker side
(:class:`SparkDatasetConverter`, the loader) never does.
"""

from sparktrain.data.converter import CACHE_DIR_CONF, default_cache_dir, make_spark_converter
from sparktrain.data.dataset import SparkDatasetConverter

__all__ = [
    "CACHE_DIR_CONF",
    "default_cache_dir",
    "SparkDatasetConverter",
    "make_spark_converter",
]
