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
(:class:`SparkDatasetConverter`, the loader) never does. The loader and
:class:`ResumableDistributedSampler` (for map-style datasets) save and restore their place in
an epoch with ``state_dict()`` / ``load_state_dict()``, also at another world size.
"""

from typing import TYPE_CHECKING, Any

from sparktrain.data.converter import CACHE_DIR_CONF, default_cache_dir, make_spark_converter
from sparktrain.data.dataset import SparkDatasetConverter

if TYPE_CHECKING:  # for type checkers and the API reference; imported on first use below
    from sparktrain.data.sampler import ResumableDistributedSampler

__all__ = [
    "CACHE_DIR_CONF",
    "ResumableDistributedSampler",
    "default_cache_dir",
    "SparkDatasetConverter",
    "make_spark_converter",
]


def __getattr__(name: str) -> Any:
    # The sampler imports torch, which the driver side of this package does not need.
    if name == "ResumableDistributedSampler":
        from sparktrain.data.sampler import ResumableDistributedSampler

        return ResumableDistributedSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
