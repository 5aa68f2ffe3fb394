"""``@distributed``: Databricks' decorator shape, on any Spark cluster (or the driver alone).

Example:
    >>> from sparktrain import distributed
    >>> @distributed(gpus=8)
    ... def train(lr):
    ...     import torch.distributed as dist, sparktrain
    ...     dist.init_process_group(sparktrain.default_backend())
    ...     return dist.get_rank()
    >>> train(0.1)               # a plain call runs here, as ordinary Python
    >>> train.distributed(0.1)   # every rank's result, by rank: [0, 1, ..., 7]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sparktrain.driver.handle import RunHandle
from sparktrain.errors import ConfigurationError
from sparktrain.log import get_logger
from sparktrain.runner import SparkRunner

_log = get_logger(__name__)


class DistributedFunction:
    """A function decorated with :func:`distributed`: call it plainly, or ``.distributed()``.

    Attributes:
        fn: the function as written.
        runner: the :class:`SparkRunner` its ``.distributed()`` calls use.
        remote: whether ``.distributed()`` returns a handle at once instead of the results.
    """

    def __init__(self, fn: Callable[..., Any], runner: SparkRunner, remote: bool) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.runner = runner
        self.remote = remote

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here, as ordinary Python."""
        return self.fn(*args, **kwargs)

    def distributed(self, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on every rank.

        Returns:
            Every rank's return value, as a list by rank; with ``remote=True``, a
            :class:`~sparktrain.driver.handle.RunHandle` at once, whose ``result()`` is
            that list.

        Raises:
            What ``SparkRunner.run_all`` raises (``WorkerFailedError``, ``CapacityError``, …).
        """
        if self.remote:
            return self.runner.submit_all(self.fn, *args, **kwargs)
        return self.runner.run_all(self.fn, *args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> RunHandle:
        """Start ``.distributed(*args, **kwargs)`` without waiting, whatever ``remote`` says."""
        return self.runner.submit_all(self.fn, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<distributed {getattr(self.fn, '__qualname__', self.fn)!r} np={self.runner.np}>"


def distributed(
    fn: Callable[..., Any] | None = None,
    *,
    np: int | tuple[int, int] | None = None,
    gpus: int | None = None,
    num_accelerators: int | None = None,
    gpu_type: str | None = None,
    accelerator_type: str | None = None,
    remote: bool = False,
    **settings: Any,
) -> Any:
    """Make ``fn`` runnable on every rank as ``fn.distributed(*args, **kwargs)``.

    The shape of Databricks' ``@distributed`` (``databricks.air`` / ``serverless_gpu``):
    ``fn.distributed(...)`` returns every rank's result as a list by rank, ``remote=True``
    makes it return a handle at once, and ``fn(...)`` still runs here as ordinary Python.
    The ranks run on the active SparkSession's executors, one per Spark barrier task, each
    with the GPUs Spark gives its task (``spark.task.resource.gpu.amount``); a negative
    ``np`` runs them on the driver, without Spark.

    Args:
        fn: the function, when used bare as ``@distributed``.
        np: the number of ranks (negative: on the driver), or ``(min, max)`` for an
            elastic run, as for :class:`SparkRunner`.
        gpus: Databricks' spelling of the number of ranks, one per GPU.
        num_accelerators: the same, as ``databricks.air`` spells it.
        gpu_type: accepted and not checked: the ranks use the GPUs Spark gives their tasks,
            whatever their type (a note is logged).
        accelerator_type: the same, as ``databricks.air`` spells it.
        remote: ``.distributed()`` returns a :class:`~sparktrain.driver.handle.RunHandle`
            at once (the notebook stays usable) instead of waiting for the results.
        **settings: any other :class:`SparkRunner` setting (``timeout``, ``spark``,
            ``max_restarts``, ``use_gpu``, …).

    Without ``np``, ``gpus`` or ``num_accelerators`` (``@distributed()``), the ranks are one
    per GPU of the driver, or one rank without GPUs, on the driver: Databricks' "every GPU of
    the node the notebook is attached to".

    Raises:
        ConfigurationError: two different rank counts, or an invalid setting.

    Example:
        >>> @distributed(np=2)
        ... def hello():
        ...     import sparktrain
        ...     return sparktrain.rank()
        >>> hello.distributed()
        [0, 1]
    """
    given = {
        name: value
        for name, value in (("np", np), ("gpus", gpus), ("num_accelerators", num_accelerators))
        if value is not None
    }
    if len(set(given.values())) > 1:
        spelled = ", ".join(f"{k}={v}" for k, v in given.items())
        raise ConfigurationError(
            f"@distributed got two numbers of ranks ({spelled}): give one of np=, gpus= or "
            "num_accelerators="
        )
    for name, count in given.items():
        if name == "np" and isinstance(count, tuple):
            continue  # np=(min, max): an elastic run, checked as SparkRunner's np
        if not isinstance(count, int) or isinstance(count, bool) or count == 0:
            raise ConfigurationError(
                f"@distributed({name}={count!r}): the number of ranks must be a non-zero int"
            )
    ranks = next(iter(given.values()), None)
    if ranks is None:
        ranks = -_driver_gpus()
    kind = gpu_type or accelerator_type
    if kind:
        _log.info(
            "gpu_type=%r is not checked: the ranks use the GPUs Spark gives their tasks "
            "(spark.task.resource.gpu.amount), whatever their type",
            kind,
        )
    runner = SparkRunner(ranks, **settings)

    def wrap(function: Callable[..., Any]) -> DistributedFunction:
        if not callable(function):
            raise ConfigurationError(
                f"@distributed decorates a function; got {type(function).__name__}"
            )
        return DistributedFunction(function, runner, remote)

    return wrap(fn) if fn is not None else wrap


def _driver_gpus() -> int:
    """The driver's GPUs, at least 1 (one rank without a GPU where it has none)."""
    try:
        import torch
    except ImportError:
        return 1
    try:
        return max(1, int(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001 - a broken CUDA setup counts as none
        return 1
