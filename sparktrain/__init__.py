"""sparktrain: distributed PyTorch training on Apache Spark, or on the driver alone.

Example:
    >>> from sparktrain import SparkRunner
    >>> result = SparkRunner(np=2).run(train, lr=0.01)   # 2 ranks on Spark executors
    >>> result = SparkRunner(np=-2).run(train, lr=0.01)  # 2 ranks on the driver
"""

from sparktrain.errors import (
    CapacityError,
    ConfigurationError,
    PayloadError,
    RendezvousTimeoutError,
    RunTimeoutError,
    SparkTrainError,
    WorkerFailedError,
    WorkerFailure,
)
from sparktrain.runner import HorovodRunner, SparkRunner
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

__version__ = "0.1.0"

__all__ = [
    "CapacityError",
    "HorovodRunner",
    "ConfigurationError",
    "PayloadError",
    "RendezvousTimeoutError",
    "RunTimeoutError",
    "SparkRunner",
    "SparkTrainError",
    "WorkerFailedError",
    "WorkerFailure",
    "attempt",
    "default_backend",
    "local_rank",
    "local_world_size",
    "log_to_driver",
    "rank",
    "report",
    "should_stop",
    "use_gpu",
    "world_size",
]
