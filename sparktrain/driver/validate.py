"""Whether an authenticated message's values make sense for a run (its field types are
checked by :func:`sparktrain.wire.protocol.parse`)."""

from __future__ import annotations

from typing import Any

from sparktrain.errors import WorkerFailure
from sparktrain.layout.cluster import TaskInfo
from sparktrain.wire import protocol

# Kinds whose "index" names a task of the run.
_INDEXED = (protocol.EXITED, protocol.RESULT_CHUNK, protocol.RESULT_END, protocol.PROBED)


def valid(kind: protocol.Kind, message: dict[str, Any], n: int) -> bool:
    """Whether ``message`` of ``kind`` fits a run of ``n`` tasks."""
    if kind is protocol.HELLO:
        try:
            info = TaskInfo.from_json(message["info"])
        except (KeyError, TypeError, ValueError):
            return False
        return 0 <= message["index"] < n and info.index == message["index"]
    if kind is protocol.PROBED and not all(
        isinstance(name, str) and isinstance(got, list) and all(isinstance(i, int) for i in got)
        for name, got in message["reached"].items()
    ):
        return False
    if kind is protocol.COLLECTIVES:
        return all(
            isinstance(row, list) and len(row) == 3 and all(type(x) is int and x >= 0 for x in row)
            for row in message["counts"]
        )
    if kind is protocol.LOGS:
        return message["dropped"] >= 0 and all(isinstance(x, str) for x in message["lines"])
    if kind in _INDEXED:
        return 0 <= message["index"] < n
    if kind is protocol.SHARED:
        return all(isinstance(v, str) for v in message["values"].values())
    if kind in (protocol.FAILURE, protocol.STACK):
        try:
            WorkerFailure.from_json(message["failure" if kind is protocol.FAILURE else "record"])
        except (KeyError, TypeError, ValueError):
            return False
    return True
