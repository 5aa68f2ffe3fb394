"""``hvd.start_timeline`` / ``hvd.stop_timeline``: a Chrome-trace JSON of the collectives.

As Horovod's, the timeline is written by rank 0 (open it in ``chrome://tracing`` or Perfetto):
one row per operation, named as Horovod names them (``allreduce.<name>``), with a
``NEGOTIATE_<OP>`` span for the agreement the ranks reach before any data moves (see
:mod:`sparktrain.hvdcompat.matching`) and an ``<OP>`` mark where the data starts to move.
It does not show how long the transfer itself took (torch.distributed does not say when an
asynchronous transfer ends without waiting on it). With ``mark_cycles=True``, a
``CYCLE_START`` mark precedes each agreement (there is no background cycle here: each
collective is its own).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from sparktrain.hvdcompat.basics import _checked


@dataclasses.dataclass
class _Recording:
    """The timeline being recorded on this process, if any."""

    path: str = ""
    mark_cycles: bool = False
    started_ns: int = 0  # time.monotonic_ns() at start
    epoch_us: int = 0  # the wall clock at start, in microseconds since the epoch
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rows: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Timeline:
    """This process's recording (Horovod's timeline is process-global)."""

    recording: _Recording | None = None


_timeline = _Timeline()


def start_timeline(file_path: str | os.PathLike[str], mark_cycles: bool = False) -> None:
    """Record the collectives into ``file_path`` (on rank 0) until :func:`stop_timeline`.

    Example:
        >>> hvd.start_timeline("/path/to/timeline.json")  # doctest: +SKIP

    Raises:
        ValueError: before ``hvd.init()``.
    """
    start(file_path, mark_cycles, _checked().rank)


def stop_timeline() -> None:
    """Write the timeline file and stop recording.

    Raises:
        ValueError: before ``hvd.init()``.
    """
    _checked()
    stop()


def start(path: str | os.PathLike[str], mark_cycles: bool, rank: int) -> None:
    """Start recording into ``path`` (rank 0 only records; a recording under way is written
    out first)."""
    stop()
    if rank != 0:
        return
    _timeline.recording = _Recording(
        path=os.fspath(path),
        mark_cycles=mark_cycles,
        started_ns=time.monotonic_ns(),
        epoch_us=time.time_ns() // 1000,
    )


def _since(recording: _Recording, ns: int) -> float:
    return (ns - recording.started_ns) / 1000.0


def _row(recording: _Recording, label: str) -> int:
    row = recording.rows.get(label)
    if row is None:
        row = recording.rows[label] = len(recording.rows) + 1
        recording.events.append(
            {"name": "process_name", "ph": "M", "pid": row, "args": {"name": label}}
        )
    return row


def agreed(kind: str, name: str | None, began_ns: int, ended_ns: int) -> None:
    """Record one agreement (``began_ns``..``ended_ns``, monotonic) and the data's start."""
    recording = _timeline.recording
    if recording is None:
        return
    label = f"{kind}.{name if name is not None else 'noname'}"
    row = _row(recording, label)
    op = kind.upper()
    if recording.mark_cycles:
        recording.events.append(
            {
                "name": "CYCLE_START",
                "ph": "i",
                "s": "g",
                "pid": 0,
                "ts": _since(recording, began_ns),
            }  # fmt: skip
        )
    recording.events += [
        {"name": f"NEGOTIATE_{op}", "ph": "B", "pid": row, "ts": _since(recording, began_ns)},
        {"name": f"NEGOTIATE_{op}", "ph": "E", "pid": row, "ts": _since(recording, ended_ns)},
        {"name": op, "ph": "i", "s": "p", "pid": row, "ts": _since(recording, ended_ns)},
    ]


def stop() -> None:
    """Write the recording under way, if any, to its file and stop recording."""
    recording, _timeline.recording = _timeline.recording, None
    if recording is None:
        return
    header = {
        "name": "process_name",
        "ph": "M",
        "pid": 0,
        "args": {
            "name": "horovod",
            "start_time_since_epoch_in_micros": recording.epoch_us,
        },
    }
    with open(recording.path, "w", encoding="utf-8") as out:
        json.dump([header, *recording.events], out)
