"""sparktrain: distributed PyTorch training on Apache Spark, or on the driver alone.

Example:
    >>> from sparktrain import SparkRunner
    >>> result = SparkRunner(np=2).run(train, lr=0.01)   # 2 ranks on Spark executors
    >>> result = SparkRunner(np=-2).run(train, lr=0.01)  # 2 ranks on the driver

Where the code runs (each folder is a boundary; a module imports only from its own layer or
the ones above it in this list, which ``tests/unit/test_layers.py`` checks):

- ``contract``, ``errors``, ``log``, ``stacks``, ``units``, ``private_dir``, ``locked_dirs``,
  ``rank_outcome``: leaves every process shares (the names that cross a process boundary, the
  error tree, logging, reading a rank's stack dump, durations and sizes, the user's private
  folder on a host and the per-process folders in it that the next process sweeps once their
  owner is gone, how a rank ended as its task tells the driver);
- ``wire/``: the authenticated frames, the one frame server, where it listens, and every
  message kind;
- ``config/``, ``layout/``, ``shipping/``: a run's settings, its layout (and the part of it
  each task is sent), what crosses to the ranks and back (its pickles, and the executors'
  Python that every Spark job of sparktrain's starts, ``shipping/python_probe``);
- ``backends/``: how ranks find each other (torch.distributed, Horovod);
- ``worker/``: inside a rank's process (never imports pyspark);
- ``checkpoint/``, ``data/``, ``plot``: libraries for the training function and the notebook;
- ``task/``: inside a Spark barrier task, or the local supervisor on the driver: the
  rendezvous, then the launcher that creates the rank processes (``task/mpi/`` for mpirun);
- ``driver/``: on the driver: the channel, the monitor, the attempts, the Spark stage;
- ``runner``: :class:`SparkRunner` and :class:`HorovodRunner` (``submit`` gives a
  :class:`RunHandle`, from ``driver/handle``);
- ``decorator``: ``@distributed``, Databricks' decorator shape over the runner;
- ``inference``, ``ml``: batched inference on executors (``predict_udf``) and the Spark ML
  stages ``TorchEstimator`` / ``TorchModel``, on top of the runner (they import pyspark);
- ``commands/`` (the ``sparktrain`` command and the doctor) and ``examples`` on top.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names, and the module each lives in. They are imported on first use (PEP 562), so
# ``import sparktrain`` costs almost nothing and a rank, which imports only
# ``sparktrain.worker.context``, never imports the driver's side.
_WHERE = {
    "CallError": "sparktrain.errors",
    "CapacityError": "sparktrain.errors",
    "ConfigurationError": "sparktrain.errors",
    "HorovodRunner": "sparktrain.runner",
    "PayloadError": "sparktrain.errors",
    "RendezvousTimeoutError": "sparktrain.errors",
    "RunHandle": "sparktrain.driver.handle",
    "RunHungError": "sparktrain.errors",
    "RunStalledError": "sparktrain.errors",
    "RunTimeoutError": "sparktrain.errors",
    "SparkRunner": "sparktrain.runner",
    "SparkTrainError": "sparktrain.errors",
    "WorkerFailedError": "sparktrain.errors",
    "WorkerFailure": "sparktrain.errors",
    "attempt": "sparktrain.worker.context",
    "default_backend": "sparktrain.worker.context",
    "distributed": "sparktrain.decorator",
    "load_kept": "sparktrain.shipping.payload",
    "local_rank": "sparktrain.worker.context",
    "local_world_size": "sparktrain.worker.context",
    "log_to_driver": "sparktrain.worker.context",
    "rank": "sparktrain.worker.context",
    "report": "sparktrain.worker.context",
    "should_stop": "sparktrain.worker.context",
    "use_gpu": "sparktrain.worker.context",
    "world_size": "sparktrain.worker.context",
}

if TYPE_CHECKING:  # what type checkers and the API reference read
    from sparktrain.decorator import distributed
    from sparktrain.driver.handle import RunHandle
    from sparktrain.errors import (
        CallError,
        CapacityError,
        ConfigurationError,
        PayloadError,
        RendezvousTimeoutError,
        RunHungError,
        RunStalledError,
        RunTimeoutError,
        SparkTrainError,
        WorkerFailedError,
        WorkerFailure,
    )
    from sparktrain.runner import HorovodRunner, SparkRunner
    from sparktrain.shipping.payload import load_kept
    from sparktrain.worker.context import (
        attempt,
        default_backend,
        local_rank,
        local_world_size,
        log_to_driver,
        rank,
        report,
        should_stop,
        use_gpu,
        world_size,
    )


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'sparktrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__version__ = "0.1.0"

# The public wings: the subpackages a user imports, each with its own ``__all__`` and a page of
# the API reference (docs/api/<wing>.md). Every other module and folder is internal and may
# change between releases; ``tests/unit/test_public_wings.py`` keeps the two lists, the
# reference and what the docs import in step.
_PUBLIC_WINGS = ("checkpoint", "data", "ml", "inference", "plot", "examples")

__all__ = [  # the stated public API (sorted); everything else is internal
    "CallError",
    "CapacityError",
    "ConfigurationError",
    "HorovodRunner",
    "PayloadError",
    "RendezvousTimeoutError",
    "RunHandle",
    "RunHungError",
    "RunStalledError",
    "RunTimeoutError",
    "SparkRunner",
    "SparkTrainError",
    "WorkerFailedError",
    "WorkerFailure",
    "attempt",
    "default_backend",
    "distributed",
    "load_kept",
    "local_rank",
    "local_world_size",
    "log_to_driver",
    "rank",
    "report",
    "should_stop",
    "use_gpu",
    "world_size",
]
