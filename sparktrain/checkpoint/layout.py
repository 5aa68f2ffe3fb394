"""How a checkpoint directory names its files, and which commit marker is the newest usable.

One directory holds one run's checkpoints (see :mod:`sparktrain.checkpoint`)::

    step-000000000120.<token>.pt                   data: torch.save bytes, a fresh name per save
    step-000000000120.<token>.dcp/                 data of a sharded save: a DCP folder
    step-000000000120.commit.json                  commit marker: data name, size, SHA-256
    .step-000000000120.<token>.pt.<tmp>.partial    a local write not yet renamed into place

Everything here is pure: names in, names or steps out; reading a file is the caller's
callable. It imports only the standard library, so the driver can use it without torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

PARTIAL_SUFFIX = ".partial"

_MARKER = re.compile(r"^step-(\d+)\.commit\.json$")
_DATA = re.compile(r"^step-(\d+)\.[0-9a-f]+\.(?:pt|dcp)$")
SHARDED_SUFFIX = ".dcp"
_PARTIAL_DATA = re.compile(r"^\.step-(\d+)\.[0-9a-f]+\.pt\.[0-9a-f]+\.partial$")


class Marker(NamedTuple):
    """The content of a well-formed commit marker.

    Attributes:
        step: the step it commits (the one in its file name too).
        data: the name of its data file, a data name of the same step.
        size: the data file's size in bytes.
        sha256: the data file's SHA-256, in hex (empty for a sharded checkpoint).
        files: for a sharded checkpoint (its data is a folder), each file's name in that
            folder with its size and SHA-256; None for a whole one.
    """

    step: int
    data: str
    size: int
    sha256: str
    files: dict[str, tuple[int, str]] | None = None


class MalformedMarker(ValueError):
    """A commit marker that is valid JSON but not a marker of its step."""


def marker_name(step: int) -> str:
    """The commit marker's name for ``step``."""
    return f"step-{step:012d}.commit.json"


def data_name(step: int, token: str, sharded: bool = False) -> str:
    """A data file's name for ``step``; ``token`` (lowercase hex) makes each save's unique.

    A sharded save's data is a folder (``.dcp``) that holds every rank's files.
    """
    return f"step-{step:012d}.{token}{SHARDED_SUFFIX if sharded else '.pt'}"


def is_sharded(data: str) -> bool:
    """Whether the data name ``data`` is a sharded save's folder."""
    return data.endswith(SHARDED_SUFFIX)


def partial_name(name: str, token: str) -> str:
    """The hidden name that a local write of ``name`` uses until it is renamed into place."""
    return f".{name}.{token}{PARTIAL_SUFFIX}"


def is_partial(name: str) -> bool:
    """Whether ``name`` is left by a local write that never reached its rename."""
    return name.startswith(".") and name.endswith(PARTIAL_SUFFIX)


def marker_step(name: str) -> int | None:
    """The step of a commit marker's name; None for any other name."""
    match = _MARKER.match(name)
    return int(match.group(1)) if match else None


def data_step(name: str) -> int | None:
    """The step of a data file's name; None for any other name."""
    match = _DATA.match(name)
    return int(match.group(1)) if match else None


def written_step(name: str) -> int | None:
    """The step of a data file, or of the ``.partial`` file of one; else None."""
    match = _DATA.match(name) or _PARTIAL_DATA.match(name)
    return int(match.group(1)) if match else None


def committed(names: Iterable[str]) -> list[tuple[int, str]]:
    """``(step, marker name)`` of every commit marker among ``names``, newest first."""
    found = ((marker_step(name), name) for name in names)
    return sorted(((step, name) for step, name in found if step is not None), reverse=True)


def parse_marker(raw: bytes, step: int) -> Marker:
    """Parse the commit marker of ``step``.

    The data name must be a data name of the same step, which also keeps it inside the
    directory.

    Raises:
        MalformedMarker: valid JSON, but not a marker of ``step``.
        ValueError: not JSON (also for bytes that are not UTF-8).
    """
    record = json.loads(raw)
    if not isinstance(record, dict) or record.get("step") != step:
        raise MalformedMarker("the commit marker is malformed")
    data, size = str(record.get("data")), record.get("size")
    if data_step(data) != step or not isinstance(size, int):
        raise MalformedMarker("the commit marker is malformed")
    if is_sharded(data) != bool(record.get("sharded")):
        raise MalformedMarker("the commit marker is malformed")
    files = _parse_files(record.get("files")) if is_sharded(data) else None
    return Marker(step, data, size, str(record.get("sha256")), files)


def _parse_files(listed: object) -> dict[str, tuple[int, str]]:
    """A sharded marker's files: plain names (inside the folder) to size and SHA-256."""
    if not isinstance(listed, dict) or not listed:
        raise MalformedMarker("the commit marker is malformed")
    files: dict[str, tuple[int, str]] = {}
    for name, entry in listed.items():
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise MalformedMarker("the commit marker is malformed")
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(size, int) or not isinstance(entry.get("sha256"), str):
            raise MalformedMarker("the commit marker is malformed")
        files[name] = (size, entry["sha256"])
    return files


def newest_committed(names: Iterable[str], read: Callable[[str], bytes]) -> tuple[str, str] | None:
    """``(marker, data)`` of the newest commit marker that parses and whose data is listed.

    This checks names only: the data's size and SHA-256 are not read, so it suits finding
    what to copy, not deciding what is loadable (``load_latest`` also verifies the data).

    Args:
        names: the directory's entries.
        read: returns a file's bytes by name; ``OSError`` or ``ValueError`` skip that marker.

    Returns:
        The marker's and its data file's names, or None when no marker qualifies.
    """
    listed = list(names)
    present = set(listed)
    for step, marker in committed(listed):
        try:
            data = parse_marker(read(marker), step).data
        except (OSError, ValueError):
            continue
        if data in present:
            return marker, data
    return None
