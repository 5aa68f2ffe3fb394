"""The task's side of the hang watch: each of its ranks' collective counts, told to the driver.

Each rank gets a small file in the task's folder that it maps and moves as it enters and
leaves collectives (see :mod:`sparktrain.worker.collectives`); a thread here reads them every
few seconds and sends the driver one ``collectives`` message for the task's ranks when any
count moved. A rank's collective costs no system call, and the driver hears at most one
message per task per interval.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sparktrain import contract, private_dir
from sparktrain.config import RunConfig
from sparktrain.wire import protocol

_SLOT = struct.Struct("=QQ")


def interval_for(config: RunConfig) -> float | None:
    """How often the counts are read for ``config``; None when the watch is off."""
    stall = config.stall_timeout
    return contract.collectives_interval(stall) if stall else None


class CollectiveSlots:
    """The counters of a task's ranks, and the thread that reports them.

    Args:
        folder: the task's private folder (its files are made there, exclusively).
        ranks: the task's ranks.
        send: sends a message to the driver (best effort).
        interval: seconds between two looks.
    """

    def __init__(
        self,
        folder: Path,
        ranks: Iterable[int],
        send: Callable[[dict[str, Any]], None],
        interval: float,
    ) -> None:
        self._send = send
        self._interval = interval
        self.paths: dict[int, Path] = {}
        self._maps: dict[int, mmap.mmap] = {}
        for rank in ranks:
            path = folder / contract.collectives_file_name(rank)
            fd = os.open(path, (private_dir.EXCLUSIVE & ~os.O_WRONLY) | os.O_RDWR, 0o600)
            try:
                os.write(fd, bytes(contract.COLLECTIVE_SLOT_BYTES))
                self._maps[rank] = mmap.mmap(fd, contract.COLLECTIVE_SLOT_BYTES)
            finally:
                os.close(fd)
            self.paths[rank] = path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[int, tuple[int, int]] = {}

    def env(self, rank: int) -> dict[str, str]:
        """What ``rank``'s process needs to count its collectives."""
        return {contract.COLLECTIVES_ENV: str(self.paths[rank])}

    def read(self) -> dict[int, tuple[int, int]]:
        """Each rank's (entered, completed) now."""
        return {rank: _SLOT.unpack_from(slot) for rank, slot in self._maps.items()}

    def report(self) -> None:
        """Tell the driver the counts, when any moved since the last report."""
        counts = self.read()
        if counts != self._last:
            self._last = counts
            rows = [[rank, e, c] for rank, (e, c) in sorted(counts.items())]
            self._send(protocol.COLLECTIVES(counts=rows))

    def start(self) -> None:
        """Report every interval until :meth:`close`."""

        def loop() -> None:
            while not self._stop.wait(self._interval):
                self.report()

        self._thread = threading.Thread(target=loop, name="sparktrain-collectives", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop reporting and unmap the files (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for slot in self._maps.values():
            slot.close()
        self._maps.clear()

    def __enter__(self) -> CollectiveSlots:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
