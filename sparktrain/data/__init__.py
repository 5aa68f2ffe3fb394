"""A Spark DataFrame to per-rank torch batches: streamed from its partitions
(:func:`from_dataframe`), or through a Parquet cache (petastorm's converter API).

Example, streamed (no copy):
    >>> from sparktrain.data import from_dataframe
    >>> def train(data):                               # on each rank
    ...     with data.loader() as batches:
    ...         for batch in batches:
    ...             ...
    >>> SparkRunner(np=2).run(train, data=from_dataframe(df, batch_size=64))

Example, through a cache:
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
from sparktrain.data.frame_loader import FrameLoader
from sparktrain.data.frame_source import DataFrameSource, from_dataframe

if TYPE_CHECKING:  # for type checkers and the API reference; imported on first use below
    from sparktrain.data.sampler import ResumableDistributedSampler

__all__ = [
    "CACHE_DIR_CONF",
    "DataFrameSource",
    "FrameLoader",
    "ResumableDistributedSampler",
    "default_cache_dir",
    "from_dataframe",
    "SparkDatasetConverter",
    "make_spark_converter",
]


def __getattr__(name: str) -> Any:
    # The sampler imports torch, which the driver side of this package does not need.
    if name == "ResumableDistributedSampler":
        from sparktrain.data.sampler import ResumableDistributedSampler

        return ResumableDistributedSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
