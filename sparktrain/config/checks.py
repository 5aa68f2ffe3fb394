"""The checks every :class:`~sparktrain.config.RunConfig` passes when it is made: types,
ranges and choices, each refusal naming the argument and the Spark conf key to change."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sparktrain.config.keys import conf_key_of, text_as
from sparktrain.config.mpi_args import parse_mpi_args
from sparktrain.contract import PLACE_VARIABLES
from sparktrain.errors import ConfigurationError
from sparktrain.units import parse_duration, parse_names, parse_size

VERBOSITIES = ("all", "log_callback_only")
STALL_ACTIONS = ("warn", "fail")
HOROVOD_IMPLS = ("horovod", "builtin")
# What a node is, for LOCAL_RANK and the like (see sparktrain.layout.cluster.node_rule).
NODE_RULES = ("auto", "host", "task")
# Why launcher="mpi" cannot run where every Spark task is a node.
MPI_TASK_NODES = (
    "launcher='mpi' cannot make every Spark task a node of its own: mpirun and Horovod under "
    "MPI count hvd.local_rank() over every rank of a host, which would not match LOCAL_RANK "
    "nor the rank's GPU. Use launcher='gloo' (Horovod's own rendezvous, which takes "
    "sparktrain's nodes), or node='host' where the tasks of a host share one GPU numbering "
    "(argument node=, or spark.sparktrain.node)"
)

# Variables each rank gets from sparktrain itself; a user's ``env`` may not override them.
RESERVED_ENV = PLACE_VARIABLES
# Variables private to sparktrain's processes (see sparktrain.contract): not the user's to set.
PRIVATE_ENV_PREFIX = "_SPARKTRAIN_"


def check(config: Any) -> None:
    """Validate ``config`` (a RunConfig being made), normalising what its text forms allow
    (durations and sizes as text, ``"off"``, ``"none"``) in place.

    Raises:
        ConfigurationError: the first value that is not valid, naming where to change it.
    """
    conf_key = functools.partial(conf_key_of, type(config))
    if isinstance(config.np, (tuple, list)) or config.elastic is not None:
        sizes = elastic_sizes(config.np if config.elastic is None else config.elastic)
        if config.elastic is None:
            object.__setattr__(config, "np", sizes[1])
        object.__setattr__(config, "elastic", sizes)
        if isinstance(config.np, int) and not sizes[0] <= config.np <= sizes[1]:
            raise ConfigurationError(
                f"an elastic run's size np={config.np!r} is outside its range {sizes}"
            )
    if isinstance(config.np, bool) or not isinstance(config.np, int) or config.np == 0:
        raise ConfigurationError(
            f"np must be a non-zero integer (np=N runs N ranks on Spark executors, "
            f"np=-N runs N ranks on the driver); got {config.np!r}"
        )
    # Which names exist is the backend registry's to say (sparktrain.backends).
    if not isinstance(config.backend, str):
        raise ConfigurationError(
            f"backend must be a string; got {config.backend!r}"
            f" (argument backend=, or {conf_key('backend')})"
        )
    if config.stall_action not in STALL_ACTIONS:
        raise ConfigurationError(
            f"stall_action must be one of {', '.join(STALL_ACTIONS)}; got "
            f"{config.stall_action!r} (argument stall_action=, or {conf_key('stall_action')})"
        )
    if config.driver_log_verbosity not in VERBOSITIES:
        raise ConfigurationError(
            f"driver_log_verbosity must be one of {', '.join(VERBOSITIES)}; "
            f"got {config.driver_log_verbosity!r}"
        )
    if isinstance(config.stall_timeout, str) and config.stall_timeout.strip().lower() == "off":
        object.__setattr__(config, "stall_timeout", None)
    for name in ("timeout", "kept_results_ttl"):
        value = getattr(config, name)
        if isinstance(value, str) and value.strip().lower() == "none":
            object.__setattr__(config, name, None)
    durations = (
        "start_timeout",
        "capacity_wait",
        "grace_period",
        "timeout",
        "stall_timeout",
        "resize_interval",
    )
    for name in (*durations, "kept_results_ttl"):
        value = text_as(parse_duration, getattr(config, name))
        object.__setattr__(config, name, value)
        if value is None and name in ("timeout", "stall_timeout", "kept_results_ttl"):
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value <= 0
            or not math.isfinite(value)
        ):
            off = " or 'off'" if name == "stall_timeout" else ""
            raise ConfigurationError(
                f"{name} must be a positive number of seconds or a duration such as "
                f"'90s', '10m' or '1h'{off}; got {value!r}"
                f" (argument {name}=, or {conf_key(name)})"
            )
    queue_wait = config.queue_wait
    if isinstance(queue_wait, str) and queue_wait.strip().lower() == "none":
        queue_wait = None
    queue_wait = text_as(parse_duration, queue_wait)
    object.__setattr__(config, "queue_wait", queue_wait)
    if queue_wait is not None and (
        isinstance(queue_wait, bool)
        or not isinstance(queue_wait, (int, float))
        or queue_wait < 0
        or not math.isfinite(queue_wait)
    ):
        raise ConfigurationError(
            "queue_wait must be a number of seconds (0: refuse at once), a duration such as "
            f"'90s' or '1h', or 'none' (wait as long as it takes); got {queue_wait!r} "
            f"(argument queue_wait=, or {conf_key('queue_wait')})"
        )
    for name in ("max_payload_bytes", "max_result_bytes"):
        value = text_as(parse_size, getattr(config, name))
        object.__setattr__(config, name, value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigurationError(f"{name} must be a positive int; got {value!r}")
    if (
        isinstance(config.max_restarts, bool)
        or not isinstance(config.max_restarts, int)
        or (config.max_restarts < 0)
    ):
        raise ConfigurationError(
            f"max_restarts must be an integer >= 0; got {config.max_restarts!r}"
        )
    if not isinstance(config.restart_on_user_error, bool):
        raise ConfigurationError(
            f"restart_on_user_error must be True or False; got {config.restart_on_user_error!r}"
        )
    if not isinstance(config.elastic_grow, bool):
        raise ConfigurationError(
            f"elastic_grow must be True or False; got {config.elastic_grow!r} "
            f"(argument elastic_grow=, or {conf_key('elastic_grow')})"
        )
    if config.elastic is not None and config.launcher == "mpi":
        raise ConfigurationError(
            f"np={config.elastic} is elastic, but launcher='mpi' is not: mpirun is given one "
            "host list for the whole run and Horovod under MPI cannot be stopped at a "
            "checkpoint to be launched at another size. Use launcher='gloo' (the default) "
            "with backend='horovod', or a fixed np with launcher='mpi'"
        )
    if config.launcher is not None and not isinstance(config.launcher, str):
        raise ConfigurationError(f"launcher must be a string or None; got {config.launcher!r}")
    try:
        mpi_args = parse_mpi_args(config.extra_mpi_args)
    except ValueError as exc:
        raise ConfigurationError(
            f"extra_mpi_args: {exc} (argument extra_mpi_args=, or {conf_key('extra_mpi_args')})"
        ) from None
    if mpi_args and config.launcher != "mpi":
        raise ConfigurationError(
            f"extra_mpi_args are mpirun's, but launcher is {config.launcher or 'auto'}: set "
            f"launcher='mpi' ({conf_key('launcher')} mpi) with backend='horovod', or drop them"
        )
    object.__setattr__(config, "extra_mpi_args", mpi_args)
    if config.nics is not None:
        try:
            object.__setattr__(config, "nics", parse_names(config.nics) or None)
        except ValueError as exc:
            raise ConfigurationError(
                f"nics: {exc}; give interface names such as 'eth0' or ['ib0', 'eth0'] "
                f"(argument nics=, or {conf_key('nics')} eth0,ib0)"
            ) from None
    if not isinstance(config.ignore_ssl, bool):
        raise ConfigurationError(f"ignore_ssl must be True or False; got {config.ignore_ssl!r}")
    if config.horovod_impl is not None and config.horovod_impl not in HOROVOD_IMPLS:
        raise ConfigurationError(
            f"horovod_impl must be one of {', '.join(HOROVOD_IMPLS)} or auto; got "
            f"{config.horovod_impl!r} (argument horovod_impl=, or {conf_key('horovod_impl')})"
        )
    if config.client_reachable not in (None, True, False):
        raise ConfigurationError(
            f"client_reachable must be True, False or None; got {config.client_reachable!r}"
            f" (argument client_reachable=, or {conf_key('client_reachable')})"
        )
    for name in ("client_address", "log_dir"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigurationError(
                f"{name} must be a non-empty string or None; got {value!r}"
                f" (argument {name}=, or {conf_key(name)})"
            )
    if config.node not in NODE_RULES:
        raise ConfigurationError(
            f"node must be one of {', '.join(NODE_RULES)}; got {config.node!r} (argument node=, "
            f"or {conf_key('node')}): task makes every Spark task a node of its own, as "
            "TorchDistributor does; host makes every host one"
        )
    if config.launcher == "mpi" and config.node == "task":
        raise ConfigurationError(MPI_TASK_NODES)
    if config.use_gpu not in (None, True, False):
        raise ConfigurationError(f"use_gpu must be True, False or None; got {config.use_gpu!r}")
    if not isinstance(config.env, Mapping):
        raise ConfigurationError(f"env must be a dict of str to str; got {type(config.env)}")
    for key, value in config.env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigurationError(
                f"env must map str to str; {key!r}: {value!r} is not (convert with str())"
            )
        if key in RESERVED_ENV:
            raise ConfigurationError(f"env may not set {key}: sparktrain sets it for each rank")
        if key.startswith(PRIVATE_ENV_PREFIX):
            raise ConfigurationError(
                f"env may not set {key}: variables named {PRIVATE_ENV_PREFIX}* are "
                "sparktrain's own, between its processes"
            )
    object.__setattr__(config, "env", MappingProxyType(dict(config.env)))


def elastic_sizes(np: Any) -> tuple[int, int]:
    """The ``(min, max)`` of an elastic ``np``, checked.

    Args:
        np: what was given as ``np``: a tuple (or list) of two positive ints, min <= max.

    Raises:
        ConfigurationError: any other form, naming the form to use.
    """
    form = (
        "np=(min, max) runs between min and max ranks on Spark executors, as many as the "
        "cluster's free task slots allow (two positive ints, min <= max, e.g. np=(2, 4))"
    )
    if not isinstance(np, (tuple, list)) or len(np) != 2:
        raise ConfigurationError(f"{form}; got np={np!r}")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in np):
        raise ConfigurationError(f"{form}; got np={tuple(np)!r}, which is not two ints")
    low, high = int(np[0]), int(np[1])
    if low < 0 or high < 0:
        raise ConfigurationError(
            f"np={(low, high)!r}: ranks on the driver (a negative np) are not elastic, since "
            f"the driver's size does not change; use np=-{max(abs(low), abs(high))} for a "
            "fixed number on the driver, or positive sizes for an elastic run on Spark"
        )
    if low < 1:
        raise ConfigurationError(f"{form}; got np={(low, high)!r}: min must be at least 1")
    if low > high:
        raise ConfigurationError(
            f"{form}; got np={(low, high)!r}, whose min is larger than its max: write "
            f"np={(high, low)!r}"
        )
    return low, high
