"""RunConfig: every setting of a run, validated once, from defaults, Spark conf, env and kwargs."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any

from sparktrain.errors import ConfigurationError

CONF_PREFIX = "spark.sparktrain."
ENV_PREFIX = "SPARKTRAIN_"
VERBOSITIES = ("all", "log_callback_only")

# Variables each rank gets from sparktrain itself; a user's ``env`` may not override them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*([0-9]+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(text: str) -> float:
    """Seconds from ``"120"``, ``"120s"``, ``"500ms"``, ``"5m"`` or ``"1h"``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use seconds, or 30s, 5m, 1h)")
    return float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]


def parse_size(text: str) -> int:
    """Bytes from ``"1048576"``, ``"64k"``, ``"256m"`` or ``"1g"``."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use bytes, or 64k, 256m, 1g)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: None if text.strip().lower() in ("", "none", "auto") else parse(text)


# field name -> (conf key suffix, parser of its text form). Fields absent here (np, env) are
# only given as arguments.
_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "backend": ("backend", str.strip),
    "driver_log_verbosity": ("driverLogVerbosity", str.strip),
    "start_timeout": ("startTimeout", parse_duration),
    "timeout": ("timeout", _optional(parse_duration)),
    "capacity_wait": ("capacityWait", parse_duration),
    "grace_period": ("gracePeriod", parse_duration),
    "use_gpu": ("useGpu", _optional(parse_bool)),
    "max_payload_bytes": ("maxPayloadBytes", parse_size),
    "max_result_bytes": ("maxResultBytes", parse_size),
    "max_restarts": ("maxRestarts", int),
    "restart_on_user_error": ("restartOnUserError", parse_bool),
    "launcher": ("launcher", _optional(str.strip)),
}


def conf_key(field: str) -> str:
    """The Spark conf key of a field, e.g. ``spark.sparktrain.startTimeout``."""
    return CONF_PREFIX + _KEYS[field][0]


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
    backend: str = "torch"
    driver_log_verbosity: str = "all"
    start_timeout: float = 120.0
    timeout: float | None = None
    capacity_wait: float = 60.0
    grace_period: float = 10.0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    use_gpu: bool | None = None
    max_payload_bytes: int = 256 << 20
    max_result_bytes: int = 256 << 20
    max_restarts: int = 0
    restart_on_user_error: bool = False
    launcher: str | None = None

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
        if self.driver_log_verbosity not in VERBOSITIES:
            raise ConfigurationError(
                f"driver_log_verbosity must be one of {', '.join(VERBOSITIES)}; "
                f"got {self.driver_log_verbosity!r}"
            )
        for name in ("start_timeout", "capacity_wait", "grace_period", "timeout"):
            value = getattr(self, name)
            if value is None and name == "timeout":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value <= 0
                or not math.isfinite(value)
            ):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds; got {value!r}"
                    f" (argument {name}=, or {conf_key(name)})"
                )
        for name in ("max_payload_bytes", "max_result_bytes"):
            value = getattr(self, name)
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
        """Build a config: built-in defaults < Spark conf < environment < ``overrides``.

        Args:
            np: number of ranks (negative: on the driver).
            overrides: keyword arguments given to the runner; ``None`` values mean "default".
            spark_conf: the session's ``spark.sparktrain.*`` entries, when there is a session.
            environ: the environment to read ``SPARKTRAIN_*`` from (default ``os.environ``).

        Raises:
            ConfigurationError: for any invalid value, naming where it came from.
        """
        values: dict[str, Any] = {}
        layers: list[tuple[str, Mapping[str, str]]] = [
            ("sparktrain/defaults.conf", _builtin_defaults()),
            ("Spark conf", spark_conf or {}),
        ]
        env = os.environ if environ is None else environ
        for field, (suffix, parse) in _KEYS.items():
            for where, layer in layers:
                key = CONF_PREFIX + suffix
                if key in layer:
                    values[field] = _parse(parse, layer[key], f"{key} in {where}")
            if env_key(field) in env:
                values[field] = _parse(parse, env[env_key(field)], env_key(field))
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


def _parse(parse: Callable[[str], Any], text: str, where: str) -> Any:
    try:
        return parse(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _builtin_defaults() -> dict[str, str]:
    text = resources.files("sparktrain").joinpath("defaults.conf").read_text(encoding="utf-8")
    return parse_conf_text(text)


def parse_conf_text(text: str) -> dict[str, str]:
    """Parse Spark-conf style ``key value`` lines; ``#`` starts a comment line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        out[key.strip()] = value.strip()
    return out
