"""Rank 0's result as it arrives over the channel, in pieces (see :mod:`sparktrain.task.result`).

The pieces of one task's result must come in order and add up to the size and SHA-256 its
last message announces, and all results together stay within the run's ``max_result_bytes``;
anything else is refused, and
the task is told why (it then keeps the result on its host). The driver holds nothing it has
not checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any


class ResultReceiver:
    """Assembles each task's result.

    Args:
        limit: the most bytes a result may have (``max_result_bytes``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: dict[int, bytearray] = {}
        self._broken: dict[int, str] = {}
        self.results: dict[int, bytearray] = {}

    def chunk(self, message: dict[str, Any]) -> None:
        """One piece (a RESULT_CHUNK message)."""
        index = message["index"]
        if index in self._broken:
            return
        part = self._parts.setdefault(index, bytearray())
        if message["offset"] != len(part):
            self._broken[index] = f"a piece at byte {message['offset']} came after {len(part)}"
            return
        data = message["blob"]
        if self._held() + len(data) > self.limit:
            # Whatever is sent, the driver never holds more than one result's worth.
            self._broken[index] = f"it is larger than max_result_bytes ({self.limit} bytes)"
            self._parts.pop(index, None)
            return
        part += data

    def _held(self) -> int:
        return sum(map(len, self._parts.values())) + sum(map(len, self.results.values()))

    def end(self, message: dict[str, Any]) -> str | None:
        """The last message (RESULT_END); None when the result is whole, else why not."""
        index = message["index"]
        part = self._parts.pop(index, bytearray())
        broken = self._broken.pop(index, None)
        if broken is not None:
            return broken
        if len(part) != message["size"]:
            return f"{len(part)} bytes arrived of {message['size']}"
        if hashlib.sha256(part).hexdigest() != message["sha256"]:
            return "its SHA-256 does not match what was sent"
        self.results[index] = part
        return None

    def attach(self, records: Iterable[dict[str, Any]]) -> None:
        """Put each received result into the record of the task that sent it."""
        for record in records:
            if record.get("result_sent") is not None and record.get("result") is None:
                record["result"] = self.results.get(record.get("index", -1))
