"""The checks every :class:`~sparktrain.config.RunConfig` passes when it is made: each field's
own (declared with it, from :mod:`sparktrain.config.validators`), then the rules that join
fields; each refusal names the argument and the Spark conf key to change."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from sparktrain.config.keys import CONF_PREFIX, conf_key_of
from sparktrain.config.validators import Arg
from sparktrain.contract import PLACE_VARIABLES
from sparktrain.errors import ConfigurationError

VERBOSITIES = ("all", "log_callback_only")
STALL_ACTIONS = ("warn", "fail")
HOROVOD_IMPLS = ("horovod", "builtin")
# What a node is, for LOCAL_RANK and the like (see sparktrain.layout.cluster.node_rule).
NODE_RULES = ("auto", "host", "task")
# What the rules mean, as node's refusal says it.
NODE_WHY = (
    "task makes every Spark task a node of its own, as TorchDistributor does; host makes "
    "every host one"
)
# What queue_wait takes, as its refusal says it.
QUEUE_WAIT = (
    "a number of seconds (0: refuse at once), a duration such as '90s' or '1h', or 'none' "
    "(wait as long as it takes)"
)
# How to write nics, as its refusal says it.
NICS_HINT = "give interface names such as 'eth0' or ['ib0', 'eth0']"
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

    First ``np=(min, max)`` becomes the elastic range, then every field's own check runs (the
    ``check`` of its declaration), then the rules that join fields.

    Raises:
        ConfigurationError: the first value that is not valid, naming where to change it.
    """
    values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    elastic_np(values)
    for field in dataclasses.fields(config):
        validate = field.metadata.get("check")
        if validate is not None:
            key = field.metadata.get("key")  # none for np and env: no Spark conf sets them
            arg = Arg(field.name, None if key is None else CONF_PREFIX + key)
            values[field.name] = validate(values[field.name], arg)
    conf_key = functools.partial(conf_key_of, type(config))
    for rule in RULES:
        rule(values, conf_key)
    for name, value in values.items():
        if value is not getattr(config, name):
            object.__setattr__(config, name, value)


def world_size(np: Any, arg: Arg) -> int:
    """``np``'s check: a non-zero int (negative: ranks on the driver)."""
    if isinstance(np, bool) or not isinstance(np, int) or np == 0:
        raise ConfigurationError(
            f"{arg.name} must be a non-zero integer (np=N runs N ranks on Spark executors, "
            f"np=-N runs N ranks on the driver); got {np!r}"
        )
    return np


def environment(env: Any, arg: Arg) -> Mapping[str, str]:
    """``env``'s check: str to str, none of sparktrain's own variables; kept read-only."""
    if not isinstance(env, Mapping):
        raise ConfigurationError(f"{arg.name} must be a dict of str to str; got {type(env)}")
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigurationError(
                f"{arg.name} must map str to str; {key!r}: {value!r} is not (convert with str())"
            )
        if key in RESERVED_ENV:
            raise ConfigurationError(f"env may not set {key}: sparktrain sets it for each rank")
        if key.startswith(PRIVATE_ENV_PREFIX):
            raise ConfigurationError(
                f"env may not set {key}: variables named {PRIVATE_ENV_PREFIX}* are "
                "sparktrain's own, between its processes"
            )
    return MappingProxyType(dict(env))


def elastic_np(values: dict[str, Any]) -> None:
    """An elastic run's range: ``np=(min, max)`` (then np is max until a size is chosen), or
    ``elastic`` as :meth:`RunConfig.to_json` wrote it, with np inside it."""
    np, elastic = values["np"], values["elastic"]
    if not isinstance(np, (tuple, list)) and elastic is None:
        return
    sizes = elastic_sizes(np if elastic is None else elastic)
    if elastic is None:
        values["np"] = np = sizes[1]
    values["elastic"] = sizes
    if isinstance(np, int) and not sizes[0] <= np <= sizes[1]:
        raise ConfigurationError(f"an elastic run's size np={np!r} is outside its range {sizes}")


def elastic_not_mpi(values: Mapping[str, Any], conf_key: Callable[[str], str]) -> None:
    """An elastic run cannot have mpirun start its ranks."""
    if values["elastic"] is not None and values["launcher"] == "mpi":
        raise ConfigurationError(
            f"np={values['elastic']} is elastic, but launcher='mpi' is not: mpirun is given "
            "one host list for the whole run and Horovod under MPI cannot be stopped at a "
            "checkpoint to be launched at another size. Use launcher='gloo' (the default) "
            "with backend='horovod', or a fixed np with launcher='mpi'"
        )


def mpi_args_need_mpi(values: Mapping[str, Any], conf_key: Callable[[str], str]) -> None:
    """extra_mpi_args are only for launcher='mpi'."""
    if values["extra_mpi_args"] and values["launcher"] != "mpi":
        raise ConfigurationError(
            f"extra_mpi_args are mpirun's, but launcher is {values['launcher'] or 'auto'}: set "
            f"launcher='mpi' ({conf_key('launcher')} mpi) with backend='horovod', or drop them"
        )


def mpi_not_task_nodes(values: Mapping[str, Any], conf_key: Callable[[str], str]) -> None:
    """launcher='mpi' cannot make every Spark task a node (see :data:`MPI_TASK_NODES`)."""
    if values["launcher"] == "mpi" and values["node"] == "task":
        raise ConfigurationError(MPI_TASK_NODES)


# The rules that join fields, checked in this order after every field's own check.
RULES: tuple[Callable[[Mapping[str, Any], Callable[[str], str]], None], ...] = (
    elastic_not_mpi,
    mpi_args_need_mpi,
    mpi_not_task_nodes,
)


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
