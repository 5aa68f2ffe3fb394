"""How a setting is declared (a dataclass field with its key, kind and doc), named in the Spark
conf and the environment, and read from its text form."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from typing import Any

from sparktrain.config.mpi_args import parse_mpi_args
from sparktrain.errors import ConfigurationError
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


# kind of setting -> (parser of its text form, writer of its text form)
KINDS: dict[str, tuple[Callable[[str], Any], Callable[[Any], str]]] = {
    "str": (str.strip, str),
    "int": (int, str),
    "bool": (parse_bool, lambda value: "true" if value else "false"),
    "duration": (parse_duration, format_duration),
    "size": (parse_size, format_size),
    "args": (parse_mpi_args, shlex.join),
    "names": (parse_names, ",".join),
}
UNSET_WORDS = ("", "none", "auto")


def setting(
    default: Any,
    key: str,
    kind: str,
    doc: str,
    unset: str | None = None,
    check: Callable[[Any, Any], Any] | None = None,
) -> Any:
    """A field that the Spark conf and the environment can set, with its default.

    Args:
        default: the built-in default (the only place it is written).
        key: the Spark conf key after ``spark.sparktrain.``.
        kind: how its text form is read and written (a key of ``KINDS``).
        doc: what it means, for ``defaults.conf``.
        unset: for a field that may be None, the word ``defaults.conf`` writes for None;
            it, ``none``, ``auto`` or nothing reads as None.
        check: how every value given is checked and normalised: a validator of
            :mod:`sparktrain.config.validators` (which imports this module); None takes the
            value as given.
    """
    metadata = {"key": key, "kind": kind, "doc": doc, "unset": unset, "check": check}
    return dataclasses.field(default=default, metadata=metadata)


def settings_of(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of ``cls`` that the Spark conf and the environment can set, in order."""
    return tuple(f for f in dataclasses.fields(cls) if "key" in f.metadata)


def conf_key_of(cls: type, field: str) -> str:
    """The Spark conf key of ``cls``'s field, e.g. ``spark.sparktrain.startTimeout``.

    Raises:
        KeyError: for a field that only a keyword argument sets (``np``, ``env``).
    """
    for setting in settings_of(cls):
        if setting.name == field:
            return CONF_PREFIX + str(setting.metadata["key"])
    raise KeyError(field)


def env_key(field: str) -> str:
    """The environment variable of a field, e.g. ``SPARKTRAIN_START_TIMEOUT``."""
    return ENV_PREFIX + field.upper()


def text_as(parse: Callable[[str], Any], value: Any) -> Any:
    """``value`` read with ``parse`` when it is text (``timeout="10m"`` as in Spark settings),
    else as it is; text that does not parse is left for the type check to refuse."""
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError:
        return value


def parse_text(parse: Callable[[str], Any], text: str, where: str) -> Any:
    """``parse(text)``; a value that does not parse is refused naming ``where`` it came from."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def parser(setting: dataclasses.Field[Any]) -> Callable[[str], Any]:
    """The reader of ``setting``'s text form (its unset words read as None)."""
    parse = KINDS[setting.metadata["kind"]][0]
    unset = setting.metadata["unset"]
    if unset is None:
        return parse
    words = (*UNSET_WORDS, unset)
    return lambda text: None if text.strip().lower() in words else parse(text)
