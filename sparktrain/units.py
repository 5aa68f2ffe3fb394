"""Durations, sizes and booleans as settings write them: ``"30s"``, ``"256m"``, ``"true"``.

Every reader of a setting's text form (RunConfig, the command line) parses with these, and
``defaults.conf`` is written with their inverses. This module imports nothing of sparktrain's.
"""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*([0-9]+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(text: str) -> float:
    """Seconds from ``"120"``, ``"120s"``, ``"500ms"``, ``"5m"``, ``"1h"`` or ``"3d"``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use seconds, or 30s, 5m, 1h, 3d)")
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


def format_duration(seconds: float) -> str:
    """The text form of a duration that :func:`parse_duration` reads back: ``"120s"``, or
    ``"3d"`` for whole days."""
    if seconds >= 86400 and float(seconds / 86400).is_integer():
        return f"{int(seconds // 86400)}d"
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    if float(seconds * 1000).is_integer():
        return f"{int(seconds * 1000)}ms"
    return f"{seconds}s"


def format_size(size: int) -> str:
    """The text form of a size that :func:`parse_size` reads back: ``"256m"``."""
    for unit in "tgmk":
        if size and size % _SIZE_UNITS[unit] == 0:
            return f"{size // _SIZE_UNITS[unit]}{unit}"
    return str(size)


def parse_names(value: Any) -> tuple[str, ...]:
    """A comma list of names (``"eth0,ib0"``, or a list of them) as a tuple; empty when none.

    Raises:
        ValueError: for something that is not names.
    """
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"not a comma list of names: {value!r}")
    names = tuple(item.strip() for item in items if item.strip())
    if any(char.isspace() for name in names for char in name):
        raise ValueError(f"a name has a space in it: {value!r}")
    return names
