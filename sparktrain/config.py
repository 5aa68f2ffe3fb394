"""RunConfig: every setting of a run, validated once, from defaults, Spark conf, env and kwargs.

The built-in defaults are the field defaults of :class:`RunConfig` and nowhere else.
``sparktrain/defaults.conf``, shipped in the package as the settings' documentation, is
written from them by :func:`render_defaults_conf`; a unit test fails when the two differ.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import textwrap
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from sparktrain.contract import PLACE_VARIABLES
from sparktrain.errors import ConfigurationError
from sparktrain.mpi_args import parse_mpi_args
from sparktrain.units import (
    format_duration,
    format_size,
    parse_bool,
    parse_duration,
    parse_names,
    parse_size,
)

CONF_PREFIX = "spark.sparktrain."
ENV_PREFIX = "SPARKTRAIN_"
VERBOSITIES = ("all", "log_callback_only")
STALL_ACTIONS = ("warn", "fail")
HOROVOD_IMPLS = ("horovod", "builtin")

# Variables each rank gets from sparktrain itself; a user's ``env`` may not override them.
RESERVED_ENV = PLACE_VARIABLES
# Variables private to sparktrain's processes (see sparktrain.contract): not the user's to set.
PRIVATE_ENV_PREFIX = "_SPARKTRAIN_"


# kind of setting -> (parser of its text form, writer of its text form)
_KINDS: dict[str, tuple[Callable[[str], Any], Callable[[Any], str]]] = {
    "str": (str.strip, str),
    "int": (int, str),
    "bool": (parse_bool, lambda value: "true" if value else "false"),
    "duration": (parse_duration, format_duration),
    "size": (parse_size, format_size),
    "args": (parse_mpi_args, shlex.join),
    "names": (parse_names, ",".join),
}
_UNSET_WORDS = ("", "none", "auto")


def _setting(default: Any, key: str, kind: str, doc: str, unset: str | None = None) -> Any:
    """A field that the Spark conf and the environment can set, with its default.

    Args:
        default: the built-in default (the only place it is written).
        key: the Spark conf key after ``spark.sparktrain.``.
        kind: how its text form is read and written (a key of ``_KINDS``).
        doc: what it means, for ``defaults.conf``.
        unset: for a field that may be None, the word ``defaults.conf`` writes for None;
            it, ``none``, ``auto`` or nothing reads as None.
    """
    metadata = {"key": key, "kind": kind, "doc": doc, "unset": unset}
    return dataclasses.field(default=default, metadata=metadata)


def conf_key(field: str) -> str:
    """The Spark conf key of a field, e.g. ``spark.sparktrain.startTimeout``.

    Raises:
        KeyError: for a field that only a keyword argument sets (``np``, ``env``).
    """
    for setting in _settings():
        if setting.name == field:
            return CONF_PREFIX + str(setting.metadata["key"])
    raise KeyError(field)


def conf_keys() -> list[str]:
    """The Spark conf key of every setting the Spark conf can set."""
    return [CONF_PREFIX + str(setting.metadata["key"]) for setting in _settings()]


def env_key(field: str) -> str:
    """The environment variable of a field, e.g. ``SPARKTRAIN_START_TIMEOUT``."""
    return ENV_PREFIX + field.upper()


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of one ``run()``; immutable and validated on construction.

    Build it with :meth:`resolve` so defaults, Spark conf and env are applied; the
    constructor alone validates what it is given.
    """

    np: int
    backend: str = _setting(
        "torch", "backend", "str", "how the ranks find each other: torch or horovod."
    )
    driver_log_verbosity: str = _setting(
        "all",
        "driverLogVerbosity",
        "str",
        "all streams every rank's output to the driver; log_callback_only only log_to_driver() "
        "messages (and failed ranks' output, in the error).",
    )
    start_timeout: float = _setting(
        120.0, "startTimeout", "duration", "how long every rank has to reach the rendezvous."
    )
    timeout: float | None = _setting(
        None, "timeout", "duration", "how long the whole run may take.", unset="none"
    )
    stall_timeout: float | None = _setting(
        600.0,
        "stallTimeout",
        "duration",
        "when no rank has printed or reported anything for this long, the run is stalled: "
        "every rank's stack is shown (off: never).",
        unset="off",
    )
    stall_action: str = _setting(
        "warn",
        "stallAction",
        "str",
        "what a stall does besides showing the stacks: warn (nothing more; shown again after "
        "the next silence) or fail (stop the run with RunStalledError, which maxRestarts "
        "restarts).",
    )
    capacity_wait: float = _setting(
        60.0,
        "capacityWait",
        "duration",
        "how long a freshly started session may take to register executors before a run is "
        "refused for lack of task slots.",
    )
    grace_period: float = _setting(
        10.0, "gracePeriod", "duration", "time between SIGTERM and SIGKILL when ranks are stopped."
    )
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    use_gpu: bool | None = _setting(
        None,
        "useGpu",
        "bool",
        "false hides GPUs from the ranks; auto gives each rank the GPU assigned to it, if any; "
        "true also refuses to run ranks on the driver without one GPU each.",
        unset="auto",
    )
    warm_start: bool = _setting(
        True,
        "warmStart",
        "bool",
        "fork each rank from a process of its task's Python worker that already imported "
        "torch and sparktrain (kept while that worker lives, at most 10 minutes unused); "
        "false starts every rank in a new interpreter.",
    )
    max_payload_bytes: int = _setting(
        256 << 20, "maxPayloadBytes", "size", "largest pickled function and arguments."
    )
    max_result_bytes: int = _setting(
        256 << 20, "maxResultBytes", "size", "largest pickled result of rank 0."
    )
    max_restarts: int = _setting(
        0,
        "maxRestarts",
        "int",
        "whole-run launches after a rank is lost (killed, executor lost, rendezvous timeout).",
    )
    restart_on_user_error: bool = _setting(
        False,
        "restartOnUserError",
        "bool",
        "also restart (up to maxRestarts) after an exception raised by the function.",
    )
    launcher: str | None = _setting(
        None,
        "launcher",
        "str",
        "who starts the ranks of backend horovod: gloo (sparktrain does; auto) or mpi (mpirun).",
        unset="auto",
    )
    extra_mpi_args: tuple[str, ...] | None = _setting(
        None,
        "extraMpiArgs",
        "args",
        "more arguments for mpirun with launcher mpi, as on a command line (e.g. "
        "-x NCCL_DEBUG=INFO --bind-to none); never run through a shell.",
        unset="none",
    )
    nics: tuple[str, ...] | None = _setting(
        None,
        "nics",
        "names",
        "network interfaces the ranks talk over, in order of preference (e.g. eth0 or "
        "ib0,eth0); auto probes each host's interfaces and takes one that reaches every other "
        "host, preferring the one that holds the executor's address.",
        unset="auto",
    )
    ignore_ssl: bool = _setting(
        False,
        "ignoreSsl",
        "bool",
        "run on a cluster with spark.ssl.enabled=true, although what the ranks send each other "
        "(torch.distributed, Gloo, NCCL, Horovod, MPI) is not encrypted; see the README's "
        "Security section.",
    )
    horovod_impl: str | None = _setting(
        None,
        "horovodImpl",
        "str",
        "which horovod.torch the ranks of backend horovod import: horovod (the installed "
        "Horovod), builtin (sparktrain's own, on torch.distributed; the installed Horovod is "
        "shadowed on the ranks only) or auto (Horovod where it is installed, else builtin).",
        unset="auto",
    )

    client_address: str | None = _setting(
        None,
        "clientAddress",
        "str",
        "under Spark Connect, the address executors use to reach this client's channel "
        "(auto: the address this machine uses to reach the Connect server).",
        unset="auto",
    )
    client_reachable: bool | None = _setting(
        None,
        "clientReachable",
        "bool",
        "under Spark Connect, whether executors can reach this client: auto tries it before "
        "the first run; false sends results and failures back through the Spark job alone "
        "(no live logs or progress; see logDir).",
        unset="auto",
    )
    log_dir: str | None = _setting(
        None,
        "logDir",
        "str",
        "a folder every executor can write and the client can read (shared storage): each "
        "rank also writes its output to <logDir>/<run id>/attempt-<n>/rank-<r>.log; the way to "
        "see logs when executors cannot reach the client.",
        unset="none",
    )

    def __post_init__(self) -> None:
        if isinstance(self.np, bool) or not isinstance(self.np, int) or self.np == 0:
            raise ConfigurationError(
                f"np must be a non-zero integer (np=N runs N ranks on Spark executors, "
                f"np=-N runs N ranks on the driver); got {self.np!r}"
            )
        # Which names exist is the backend registry's to say (sparktrain.backends).
        if not isinstance(self.backend, str):
            raise ConfigurationError(
                f"backend must be a string; got {self.backend!r}"
                f" (argument backend=, or {conf_key('backend')})"
            )
        if self.stall_action not in STALL_ACTIONS:
            raise ConfigurationError(
                f"stall_action must be one of {', '.join(STALL_ACTIONS)}; got "
                f"{self.stall_action!r} (argument stall_action=, or {conf_key('stall_action')})"
            )
        if self.driver_log_verbosity not in VERBOSITIES:
            raise ConfigurationError(
                f"driver_log_verbosity must be one of {', '.join(VERBOSITIES)}; "
                f"got {self.driver_log_verbosity!r}"
            )
        if isinstance(self.stall_timeout, str) and self.stall_timeout.strip().lower() == "off":
            object.__setattr__(self, "stall_timeout", None)
        if isinstance(self.timeout, str) and self.timeout.strip().lower() == "none":
            object.__setattr__(self, "timeout", None)
        for name in ("start_timeout", "capacity_wait", "grace_period", "timeout", "stall_timeout"):
            value = _text_as(parse_duration, getattr(self, name))
            object.__setattr__(self, name, value)
            if value is None and name in ("timeout", "stall_timeout"):
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
        for name in ("max_payload_bytes", "max_result_bytes"):
            value = _text_as(parse_size, getattr(self, name))
            object.__setattr__(self, name, value)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive int; got {value!r}")
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or (self.max_restarts < 0)
        ):
            raise ConfigurationError(
                f"max_restarts must be an integer >= 0; got {self.max_restarts!r}"
            )
        if not isinstance(self.restart_on_user_error, bool):
            raise ConfigurationError(
                f"restart_on_user_error must be True or False; got {self.restart_on_user_error!r}"
            )
        if self.launcher is not None and not isinstance(self.launcher, str):
            raise ConfigurationError(f"launcher must be a string or None; got {self.launcher!r}")
        try:
            mpi_args = parse_mpi_args(self.extra_mpi_args)
        except ValueError as exc:
            raise ConfigurationError(
                f"extra_mpi_args: {exc} (argument extra_mpi_args=, or {conf_key('extra_mpi_args')})"
            ) from None
        if mpi_args and self.launcher != "mpi":
            raise ConfigurationError(
                f"extra_mpi_args are mpirun's, but launcher is {self.launcher or 'auto'}: set "
                f"launcher='mpi' ({conf_key('launcher')} mpi) with backend='horovod', or drop them"
            )
        object.__setattr__(self, "extra_mpi_args", mpi_args)
        if self.nics is not None:
            try:
                object.__setattr__(self, "nics", parse_names(self.nics) or None)
            except ValueError as exc:
                raise ConfigurationError(
                    f"nics: {exc}; give interface names such as 'eth0' or ['ib0', 'eth0'] "
                    f"(argument nics=, or {conf_key('nics')} eth0,ib0)"
                ) from None
        if not isinstance(self.ignore_ssl, bool):
            raise ConfigurationError(f"ignore_ssl must be True or False; got {self.ignore_ssl!r}")
        if self.horovod_impl is not None and self.horovod_impl not in HOROVOD_IMPLS:
            raise ConfigurationError(
                f"horovod_impl must be one of {', '.join(HOROVOD_IMPLS)} or auto; got "
                f"{self.horovod_impl!r} (argument horovod_impl=, or {conf_key('horovod_impl')})"
            )
        if self.client_reachable not in (None, True, False):
            raise ConfigurationError(
                f"client_reachable must be True, False or None; got {self.client_reachable!r}"
                f" (argument client_reachable=, or {conf_key('client_reachable')})"
            )
        for name in ("client_address", "log_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(
                    f"{name} must be a non-empty string or None; got {value!r}"
                    f" (argument {name}=, or {conf_key(name)})"
                )
        if self.use_gpu not in (None, True, False):
            raise ConfigurationError(f"use_gpu must be True, False or None; got {self.use_gpu!r}")
        if not isinstance(self.env, Mapping):
            raise ConfigurationError(f"env must be a dict of str to str; got {type(self.env)}")
        for key, value in self.env.items():
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
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def local(self) -> bool:
        """True when the ranks run on the driver (np < 0)."""
        return self.np < 0

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return abs(self.np)

    @classmethod
    def resolve(
        cls,
        np: int,
        overrides: Mapping[str, Any] | None = None,
        spark_conf: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> RunConfig:
        """Build a config: field defaults < Spark conf < environment < ``overrides``.

        Args:
            np: number of ranks (negative: on the driver).
            overrides: keyword arguments given to the runner; ``None`` values mean "default".
            spark_conf: the session's ``spark.sparktrain.*`` entries, when there is a session.
            environ: the environment to read ``SPARKTRAIN_*`` from (default ``os.environ``).

        Raises:
            ConfigurationError: for any invalid value, naming where it came from.
        """
        values: dict[str, Any] = {}
        conf = spark_conf or {}
        env = os.environ if environ is None else environ
        for setting in _settings():
            parse = _parser(setting)
            key, variable = conf_key(setting.name), env_key(setting.name)
            if key in conf:
                values[setting.name] = _parse(parse, conf[key], f"{key} in Spark conf")
            if variable in env:
                values[setting.name] = _parse(parse, env[variable], variable)
        for name, value in (overrides or {}).items():
            if name not in {f.name for f in dataclasses.fields(cls)} or name == "np":
                raise ConfigurationError(f"unknown setting {name!r}")
            if value is not None:
                values[name] = value
        return cls(np=np, **values)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict, for shipping to tasks."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["env"] = dict(self.env)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_json`."""
        return cls(**data)


def _text_as(parse: Callable[[str], Any], value: Any) -> Any:
    """``value`` read with ``parse`` when it is text (``timeout="10m"`` as in Spark settings),
    else as it is; text that does not parse is left for the type check to refuse."""
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError:
        return value


def _parse(parse: Callable[[str], Any], text: str, where: str) -> Any:
    try:
        return parse(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _settings() -> tuple[dataclasses.Field[Any], ...]:
    """The fields that the Spark conf and the environment can set, in declaration order."""
    return tuple(f for f in dataclasses.fields(RunConfig) if "key" in f.metadata)


def _parser(setting: dataclasses.Field[Any]) -> Callable[[str], Any]:
    parse = _KINDS[setting.metadata["kind"]][0]
    unset = setting.metadata["unset"]
    if unset is None:
        return parse
    words = (*_UNSET_WORDS, unset)
    return lambda text: None if text.strip().lower() in words else parse(text)


_DEFAULTS_HEADER = """\
# Built-in defaults of sparktrain, written from the field defaults of sparktrain.config.RunConfig,
# which are the only source: change a default there, then regenerate this file from the
# repository's root with
# python -c "import sparktrain.config as c; print(c.render_defaults_conf(), end='')" > sparktrain/defaults.conf
#
# Every key can be overridden, in increasing precedence, by the Spark conf of the session (same
# key), by an environment variable (SPARKTRAIN_ + the argument's name in upper case, e.g.
# SPARKTRAIN_START_TIMEOUT), and by a keyword argument of SparkRunner (start_timeout=...).
# Durations are seconds (or 500ms, 30s, 5m, 1h); sizes are bytes (or 64k, 256m, 1g); none and
# auto mean no value, and so does off where it is the value shown. The format is Spark's:
# `key value` or `key=value`, # for comments.
"""


def render_defaults_conf() -> str:
    """The text of ``sparktrain/defaults.conf``: every setting, its meaning and its default."""
    parts = [_DEFAULTS_HEADER]
    for setting in _settings():
        meta = setting.metadata
        about = f"{setting.name} ({env_key(setting.name)}): {meta['doc']}"
        value = setting.default
        text = meta["unset"] if value is None else _KINDS[meta["kind"]][1](value)
        parts.append("\n" + textwrap.fill(about, 98, initial_indent="# ", subsequent_indent="# "))
        parts.append(f"\n{conf_key(setting.name):<40} {text}".rstrip() + "\n")
    return "".join(parts)
