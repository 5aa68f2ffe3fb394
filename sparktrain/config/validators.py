"""The checks a setting declares with its field (``setting(..., check=duration())``).

Each function here makes a validator: a callable that takes the value given and the
:class:`Arg` it was given as, and returns the value to keep (text forms read, ``"off"`` or
``"none"`` made None) or raises :class:`~sparktrain.errors.ConfigurationError` naming the
argument and its Spark conf key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from sparktrain.config.keys import text_as
from sparktrain.errors import ConfigurationError
from sparktrain.units import parse_duration, parse_size

# What a duration setting takes, as its refusal says it.
SECONDS = "a positive number of seconds or a duration such as '90s', '10m' or '1h'"


@dataclasses.dataclass(frozen=True)
class Arg:
    """Where a value was given: the argument's name and its Spark conf key (None for an
    argument only a keyword sets, such as ``np`` and ``env``)."""

    name: str
    key: str | None = None

    def where(self, example: str = "") -> str:
        """`` (argument name=, or spark.sparktrain.key)``, the key followed by ``example``;
        empty for an argument that the Spark conf cannot set."""
        if self.key is None:
            return ""
        return f" (argument {self.name}=, or {self.key}{example})"


Validator = Callable[[Any, Arg], Any]


def _refuse(arg: Arg, text: str) -> ConfigurationError:
    """The refusal ``text`` followed by where to change it."""
    return ConfigurationError(text + arg.where())


def choice(values: Sequence[str], *, unset: str | None = None, why: str = "") -> Validator:
    """One of ``values``.

    Args:
        values: the names allowed.
        unset: the word for None where None is allowed too (``"auto"``); None refuses None.
        why: what the names mean, after the refusal.
    """
    listed = ", ".join(values) + (f" or {unset}" if unset is not None else "")

    def check(value: Any, arg: Arg) -> Any:
        if value in values or (value is None and unset is not None):
            return value
        text = f"{arg.name} must be one of {listed}; got {value!r}{arg.where()}"
        raise ConfigurationError(f"{text}: {why}" if why else text)

    return check


def duration(*, unset: str | None = None, zero: bool = False, what: str = SECONDS) -> Validator:
    """A number of seconds, or text such as ``"90s"`` (read as seconds); finite, above 0.

    Args:
        unset: the word (any case) that, like None, means no duration; None refuses both.
        zero: allow 0 as well.
        what: what is allowed, as the refusal says it.
    """

    def check(value: Any, arg: Arg) -> Any:
        if unset is not None and isinstance(value, str) and value.strip().lower() == unset:
            return None
        value = text_as(parse_duration, value)
        if value is None and unset is not None:
            return value
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
            or (value == 0 and not zero)
        ):
            raise _refuse(arg, f"{arg.name} must be {what}; got {value!r}")
        return value

    return check


def size() -> Validator:
    """A number of bytes above 0, or text such as ``"256m"`` (read as bytes)."""

    def check(value: Any, arg: Arg) -> Any:
        value = text_as(parse_size, value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _refuse(arg, f"{arg.name} must be a positive int; got {value!r}")
        return value

    return check


def at_least(minimum: int) -> Validator:
    """An int (not a bool) of at least ``minimum``.

    Args:
        minimum: the least value allowed.
    """

    def check(value: Any, arg: Arg) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _refuse(arg, f"{arg.name} must be an integer >= {minimum}; got {value!r}")
        return value

    return check


def boolean(*, allow_none: bool = False) -> Validator:
    """True or False (or None, with ``allow_none``: where None means "auto").

    Args:
        allow_none: allow None too; values equal to True or False (1, 0) then pass as well.
    """

    def check(value: Any, arg: Arg) -> Any:
        if allow_none:
            if value not in (None, True, False):
                raise _refuse(arg, f"{arg.name} must be True, False or None; got {value!r}")
        elif not isinstance(value, bool):
            raise _refuse(arg, f"{arg.name} must be True or False; got {value!r}")
        return value

    return check


def string(*, allow_none: bool = False, non_empty: bool = False) -> Validator:
    """A str, taken as it is.

    Args:
        allow_none: allow None too.
        non_empty: refuse a str that is empty or only spaces.
    """
    what = ("a non-empty string" if non_empty else "a string") + (" or None" if allow_none else "")

    def check(value: Any, arg: Arg) -> Any:
        if value is None and allow_none:
            return value
        if not isinstance(value, str) or (non_empty and not value.strip()):
            raise _refuse(arg, f"{arg.name} must be {what}; got {value!r}")
        return value

    return check


def parsed(
    parse: Callable[[Any], Any], *, none_if_empty: bool = False, hint: str = "", example: str = ""
) -> Validator:
    """What ``parse`` makes of the value (text or a list of it); its ValueError is refused.

    Args:
        parse: the reader, e.g. :func:`~sparktrain.units.parse_names`.
        none_if_empty: None stays None and an empty result becomes None.
        hint: how to write the value, after the reader's own words.
        example: a value, after the conf key in the refusal.
    """

    def check(value: Any, arg: Arg) -> Any:
        if value is None and none_if_empty:
            return value
        try:
            result = parse(value)
        except ValueError as exc:
            hinted = f"{exc}; {hint}" if hint else str(exc)
            raise ConfigurationError(f"{arg.name}: {hinted}{arg.where(example)}") from None
        return (result or None) if none_if_empty else result

    return check
