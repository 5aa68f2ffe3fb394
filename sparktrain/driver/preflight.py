"""Checks of the Spark application's settings before a run is submitted.

* ``use_gpu=True`` on an application whose tasks get no GPUs is refused, naming the settings
  that give tasks GPUs (the ranks would otherwise train on CPU without a word).
* An application that asked Spark to encrypt its traffic (``spark.ssl.enabled`` or
  ``spark.network.crypto.enabled``) is refused unless ``ignore_ssl`` is set: what the ranks
  send each other (torch.distributed's store, Gloo and NCCL, Horovod's rendezvous, MPI) is not
  encrypted, and sparktrain's channel is authenticated, not encrypted.
* ``spark.task.resource.gpu.amount=k`` makes each task run k ranks, one per GPU: np must be
  a multiple of k, and a fractional amount (two ranks on one GPU) is refused.
"""

from __future__ import annotations

from typing import Any

from sparktrain.backends import get_backend
from sparktrain.config import RunConfig, conf_key
from sparktrain.errors import ConfigurationError

_ENCRYPTION = ("spark.ssl.enabled", "spark.network.crypto.enabled")
_TASK_GPUS = "spark.task.resource.gpu.amount"


def check_application(conf: Any, config: RunConfig) -> None:
    """Refuse a run on Spark executors that cannot do what was asked, before submitting it.

    Args:
        conf: the application's SparkConf (anything with ``get(key, default)``).
        config: the run's settings.

    Raises:
        ConfigurationError: ``use_gpu=True`` without GPUs for tasks, or an encrypted
            application without ``ignore_ssl``; the message names the settings to change.
    """
    _check_encryption(conf, config)
    _check_gpus(conf, config)


def _is_true(conf: Any, key: str) -> bool:
    return str(conf.get(key, "false")).strip().lower() == "true"


def _check_encryption(conf: Any, config: RunConfig) -> None:
    if config.ignore_ssl:
        return
    found = [key for key in _ENCRYPTION if _is_true(conf, key)]
    if not found:
        return
    raise ConfigurationError(
        f"this Spark application encrypts its traffic ({found[0]}=true), but the traffic "
        "between ranks (torch.distributed's store, Gloo or NCCL collectives, Horovod's "
        "rendezvous, MPI) is not encrypted, and sparktrain's own channel is authenticated but "
        f"not encrypted. To run anyway, on a network you trust, set ignore_ssl=True "
        f"({conf_key('ignore_ssl')} true); see the Security page of the documentation (docs/security.md)"
    )


def _check_gpus(conf: Any, config: RunConfig) -> None:
    if config.use_gpu is not True:
        return
    amount = conf.get("spark.task.resource.gpu.amount", None)
    try:
        per_task = float(amount) if amount is not None else 0.0
    except ValueError:
        per_task = 0.0
    if per_task > 0:
        return
    shown = f"={amount}" if amount is not None else " is not set"
    raise ConfigurationError(
        f"use_gpu=True, but Spark gives this application's tasks no GPUs "
        f"(spark.task.resource.gpu.amount{shown}), so every rank would train on CPU. Give "
        "tasks GPUs with spark.executor.resource.gpu.amount, "
        "spark.executor.resource.gpu.discoveryScript and spark.task.resource.gpu.amount "
        "(e.g. 1; on a standalone cluster also spark.worker.resource.gpu.amount and "
        "spark.worker.resource.gpu.discoveryScript), set when the application starts; or "
        f"use_gpu=None to use GPUs only where tasks have them ({conf_key('use_gpu')})"
    )


def ranks_per_task(conf: Any, config: RunConfig) -> int:
    """How many ranks each barrier task runs: one per GPU the task is given.

    With ``spark.task.resource.gpu.amount=k`` (a whole number), a task holds k GPUs and runs
    k ranks, one on each, so the stage has ``np / k`` tasks. A fractional amount would put
    two ranks on one GPU, which NCCL refuses: it is refused here, unless ``use_gpu=False``
    (the amount then only limits how many tasks an executor runs, and each runs one rank).

    Args:
        conf: the application's SparkConf (anything with ``get(key, default)``).
        config: the run's settings (``world_size`` is np).

    Returns:
        k, at least 1.

    Raises:
        ConfigurationError: a fractional or malformed amount, or np not a multiple of k; the
            message names np, the amount and what to set.
    """
    amount = conf.get(_TASK_GPUS, None)
    if amount is None or not str(amount).strip():
        return 1
    try:
        value = float(amount)
    except ValueError:
        raise ConfigurationError(
            f"{_TASK_GPUS}={amount!r} is not a number: set it to the whole number of GPUs "
            "each task (and so each group of ranks) gets, e.g. 1"
        ) from None
    if value <= 0:
        return 1
    if value != int(value):
        if config.use_gpu is False:
            return 1
        raise ConfigurationError(
            f"{_TASK_GPUS}={amount} gives tasks a fraction of a GPU, so several ranks would "
            "share one GPU, which NCCL refuses and which slows every rank sharing it. Set it "
            "to a whole number k (each task then runs k ranks, one per GPU), or pass "
            f"use_gpu=False ({conf_key('use_gpu')}) to train on CPU"
        )
    k = int(value)
    np = config.world_size
    if np % k and config.elastic is None:  # an elastic run's sizes: see elastic.smallest
        lower, upper = np // k * k, (np // k + 1) * k
        choices = f"{lower} or {upper}" if lower else f"{upper}"
        raise ConfigurationError(
            f"np={np} is not a multiple of {_TASK_GPUS}={k}: each task holds {k} GPUs and "
            f"runs {k} ranks, one per GPU, so np must be a multiple of {k}. Set np to "
            f"{choices}, or set {_TASK_GPUS}=1 for one rank per task"
        )
    return k


def check_run(config: RunConfig, all_ranks: bool) -> None:
    """Every check of a run's settings against each other that costs nothing and holds
    wherever the run goes (each place checks its own: see ``Place.check``).

    Args:
        config: the run's resolved settings.
        all_ranks: every rank's value is to come back (``run_all``).
    """
    if all_ranks and config.launcher == "mpi":
        raise ConfigurationError(
            "run_all returns every rank's value, which launcher='mpi' does not bring back "
            "(it returns rank 0's alone): use run(), or the default launcher (launcher=None)"
        )
    get_backend(config.backend).check(config)
