"""np < 0: the local supervisor runs all ranks as subprocesses of the driver, no Spark."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sparktrain.task.entry import TaskJob, run_local

# Rows per batch the driver reads a DataFrame in for local ranks (a bounded piece at a time).
_DRIVER_BATCH_ROWS = 4096

Done = Callable[[list[dict[str, Any]] | None, BaseException | None], None]


class LocalLaunch:
    """Runs :func:`sparktrain.task.entry.run_local` in a thread of the driver."""

    def __init__(self, job: TaskJob, frame: Any = None, groups: Any = None) -> None:
        self.job = job
        # The Spark jobs that read ``frame`` run in this group (a Connect tag): a run that
        # ends cancels what is left of them, a partition still being computed included.
        self._group = f"sparktrain-read-{job.run_id}-{job.attempt}"
        # A run given a DataFrame: read here, a partition at a time, and streamed to the ranks,
        # in Spark jobs of the place the DataFrame's session is (``groups``, a Place).
        self.frame = frame
        self.groups = groups
        self.read = False  # the frame was read to its end
        self._lock = threading.Lock()
        self._done: Done | None = None

    def _finish(self, records: list[dict[str, Any]] | None, error: BaseException | None) -> None:
        with self._lock:
            done, self._done = self._done, None
        if done is not None:
            done(records, error)

    def start(self, done: Done) -> None:
        self._done = done

        def body() -> None:
            try:
                batches = None if self.frame is None else self._batches()
                try:
                    records = run_local(self.job, batches)
                finally:
                    if self.frame is not None and not self.read:
                        with contextlib.suppress(Exception):  # the session may be gone
                            self.groups.cancel_group(self._group)
            except BaseException as exc:  # noqa: BLE001 - handed to the monitor
                self._finish(None, exc)
            else:
                self._finish(records, None)

        threading.Thread(target=body, name="sparktrain-local", daemon=True).start()

    def _batches(self) -> Iterator[Any]:
        """The frame's batches, read in the thread that iterates, in the run's own Spark job
        group (or Connect tag); :attr:`read` is set once the last was."""
        from sparktrain.data.stream import dataframe_batches

        self.groups.open_group(self._group, "sparktrain: reading the DataFrame")
        try:
            yield from dataframe_batches(self.frame.ordered(), _DRIVER_BATCH_ROWS)
            self.read = True
        finally:
            with contextlib.suppress(Exception):  # the session may be gone
                self.groups.close_group(self._group)

    def cancel(self) -> None:
        """Report the launch as ended now.

        The monitor cancels once the supervisor has confirmed its ranks are gone, or when none
        was started, or after the grace period (by then the supervisor, told to abort over the
        channel, has escalated to SIGKILL); a supervisor thread still stuck before starting
        any rank holds nothing that needs waiting for.
        """
        self._finish(None, None)

    def failed_task(self, error: BaseException) -> None:
        return None  # no Spark task: the supervisor's own error says it all

    def describe_error(self, error: BaseException) -> str:
        return f"the local supervisor failed: {type(error).__name__}: {error}"
