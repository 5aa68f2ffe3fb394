"""A task's ranks' output on its way to the driver: bounded in rate, memory and line length.

A rank that prints a million lines a second must not slow the other ranks, fill the driver's
memory or push every other rank's lines out of the notebook. So the pump threads that read the
ranks' output never wait on the network: each line is written whole to the rank's file under
``log_dir`` (when set: nothing is dropped there), then offered to a :class:`LogForwarder`,
which keeps it only if the rank is within its budget (:data:`LINE_RATE` lines a second, with
bursts of :data:`BURST`) and the task's queue has room (:data:`MAX_QUEUED` lines). One sender
thread per task sends what is queued in batches (one ``logs`` message per rank and batch), so
only it waits when the driver is slow (its channel then stops reading, see
:mod:`sparktrain.driver.channel`). Every line not forwarded is counted, and the count travels
with the rank's next batch, so the driver says how many were not shown and where they are.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from sparktrain.log import get_logger
from sparktrain.task.assignment import TaskJob
from sparktrain.wire import protocol

_log = get_logger(__name__)

# Lines a second each rank may send to the driver, and how many it may send at once.
LINE_RATE = 1000.0
BURST = 5000
# Lines the task holds for the driver, all ranks together.
MAX_QUEUED = 20000
# Characters of one line the driver is sent (a longer one is cut, and says so).
MAX_LINE = 8192
# A batch: at most this many lines, or bytes, per message.
BATCH_LINES = 128
BATCH_BYTES = 32 * 1024
# How long closing waits for queued lines to reach the driver.
FLUSH_WAIT = 5.0


def attempt_folder(attempt: int) -> str:
    """The name of the folder of ``attempt`` (0-based, as ``sparktrain.attempt()``) under the
    run's: ``attempt-<n>``, counted from 1 as the driver's messages count attempts."""
    return f"attempt-{attempt + 1}"


def log_folder(job: TaskJob) -> Path | None:
    """Where this attempt's ranks write their output: ``<log_dir>/<run id>/attempt-<n>``
    (see :func:`attempt_folder`)."""
    root = job.run_config.log_dir
    if root is None:
        return None
    return Path(root) / job.run_id / attempt_folder(job.attempt)


class RankFiles:
    """Each rank's whole output, appended to ``folder/rank-<r>.log`` (nothing dropped).

    Args:
        folder: where the files go (``<log_dir>/<run id>/attempt-<n>``), or None for none.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._files: dict[int, TextIO | None] = {}  # None: it cannot be opened
        self._lock = threading.Lock()

    def where(self, rank: int) -> str:
        """The file of ``rank``'s output, or ``""`` when none is kept."""
        return "" if self.folder is None else str(self.folder / f"rank-{rank}.log")

    def write(self, rank: int, line: str) -> None:
        """Append one line (best effort: a full disk never fails the run)."""
        if self.folder is None:
            return
        with self._lock:
            if rank not in self._files:
                self._files[rank] = open_rank_log(self.folder, rank)
            out = self._files[rank]
            if out is None:
                return
            try:
                out.write(line.rstrip("\n") + "\n")
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Close every file."""
        with self._lock:
            for out in self._files.values():
                try:
                    if out is not None:
                        out.close()
                except OSError:
                    pass
            self._files.clear()


_LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def open_rank_log(folder: Path, rank: int) -> TextIO | None:
    """``folder/rank-<rank>.log`` for appending, created 0600; None (with one warning) when it
    cannot be.

    An existing link is refused, not followed: ``log_dir`` may be shared, and a planted
    ``rank-N.log`` link must not make the task append to a file of the attacker's choice.
    """
    path = folder / f"rank-{rank}.log"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, _LOG_FLAGS, 0o600)
    except OSError as exc:
        reason = "it is a symbolic link" if os.path.islink(path) else str(exc)
        _log.warning("rank %d's output is not written to %s: %s", rank, path, reason)
        return None
    return open(fd, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by RankFiles


class LogForwarder:
    """Lines of a task's ranks for the driver, sent in batches by one thread of its own.

    Args:
        send: sends one message to the driver (may block; only the sender thread calls it).
        where: the file that keeps a rank's whole output (``""``: none).
        rate: lines a second each rank may send.
        burst: lines a rank may send at once.
        max_queued: lines held for the driver, all ranks together.
    """

    def __init__(
        self,
        send: Callable[[dict[str, Any]], None],
        where: Callable[[int], str] = lambda rank: "",
        *,
        rate: float = LINE_RATE,
        burst: int = BURST,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self._send = send
        self._where = where
        self.rate = rate
        self.burst = burst
        self.max_queued = max_queued
        self._queue: collections.deque[tuple[int, str]] = collections.deque()
        # Per rank: budget left, when it was last topped up, lines not forwarded (unsent).
        self._tokens: dict[int, float] = {}
        self._refilled: dict[int, float] = {}
        self._dropped: dict[int, int] = {}
        # Totals, for the task's own figures and for tests.
        self.dropped = 0
        self.shortened = 0
        self._cond = threading.Condition()
        self._closing = False
        self._idle = True
        self._thread = threading.Thread(target=self._run, name="sparktrain-logs", daemon=True)
        self._thread.start()

    def line(self, rank: int, line: str) -> None:
        """Offer one line of ``rank`` (from a pump thread): kept if within bounds, else
        counted. Never waits for the driver."""
        if len(line) > MAX_LINE:
            line = f"{line[:MAX_LINE]} [... {len(line) - MAX_LINE:,} more characters not shown]"
            self.shortened += 1
        now = time.monotonic()
        with self._cond:
            tokens = self._tokens.get(rank, float(self.burst))
            last = self._refilled.get(rank, now)
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            self._refilled[rank] = now
            if tokens < 1.0 or len(self._queue) >= self.max_queued or self._closing:
                self._tokens[rank] = tokens
                self._dropped[rank] = self._dropped.get(rank, 0) + 1
                self.dropped += 1
                # The count must reach the driver even if this rank prints nothing more.
                self._cond.notify()
                return
            self._tokens[rank] = tokens - 1.0
            self._queue.append((rank, line))
            self._cond.notify()

    def _batch(self) -> list[dict[str, Any]]:
        """Take up to one batch of queued lines (and every pending drop count), by rank."""
        lines: dict[int, list[str]] = {}
        size = 0
        taken = 0
        while self._queue and taken < BATCH_LINES and size < BATCH_BYTES:
            rank, line = self._queue.popleft()
            lines.setdefault(rank, []).append(line)
            size += len(line)
            taken += 1
        dropped, self._dropped = self._dropped, {}
        ranks = sorted(set(lines) | set(dropped))
        return [
            protocol.LOGS(
                rank=rank,
                lines=lines.get(rank, []),
                dropped=dropped.get(rank, 0),
                where=self._where(rank) if dropped.get(rank) else "",
            )
            for rank in ranks
        ]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._dropped and not self._closing:
                    self._idle = True
                    self._cond.notify_all()
                    self._cond.wait()
                if self._closing and not self._queue and not self._dropped:
                    self._idle = True
                    self._cond.notify_all()
                    return
                self._idle = False
                messages = self._batch()
            for message in messages:
                try:
                    self._send(message)
                except Exception:  # noqa: BLE001 - logs are best-effort, never fatal
                    pass

    def flush(self, timeout: float = FLUSH_WAIT) -> bool:
        """Wait until every queued line has been handed to ``send``; False if time ran out."""
        deadline = time.monotonic() + timeout
        with self._cond:
            return self._cond.wait_for(
                lambda: self._idle and not self._queue and not self._dropped,
                timeout=max(0.0, deadline - time.monotonic()),
            )

    def close(self, timeout: float = FLUSH_WAIT) -> None:
        """Send what is queued (waiting at most ``timeout``), then stop the sender thread;
        lines still queued then are counted as not shown."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            for rank, _ in self._queue:
                self._dropped[rank] = self._dropped.get(rank, 0) + 1
                self.dropped += 1
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
