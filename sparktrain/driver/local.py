"""np < 0: the local supervisor runs all ranks as subprocesses of the driver, no Spark."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sparktrain.task.entry import TaskJob, run_local


class LocalLaunch:
    """Runs :func:`sparktrain.task.entry.run_local` in a thread of the driver."""

    def __init__(self, job: TaskJob) -> None:
        self.job = job
        self._thread: threading.Thread | None = None

    def start(
        self, done: Callable[[list[dict[str, Any]] | None, BaseException | None], None]
    ) -> None:
        def body() -> None:
            try:
                records = run_local(self.job)
            except BaseException as exc:  # noqa: BLE001 - handed to the monitor
                done(None, exc)
            else:
                done(records, None)

        self._thread = threading.Thread(target=body, name="sparktrain-local", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """The supervisor has already been told to abort over the channel; nothing harder
        is needed because it escalates to SIGKILL after the grace period itself."""

    def describe_error(self, error: BaseException) -> str:
        return f"the local supervisor failed: {type(error).__name__}: {error}"
