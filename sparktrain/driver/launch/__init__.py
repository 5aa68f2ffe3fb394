"""The ways a run's tasks are launched, behind one protocol: Spark barrier tasks on a classic
session (``stage``), on a Spark Connect session (``connect``), or the local supervisor on the
driver for ``np < 0`` (``local``). The monitor sees each through :class:`Launch`; the place a
run goes to (:mod:`sparktrain.driver.places`) makes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Launch(Protocol):
    """A started set of tasks: Spark barrier tasks or the local supervisor."""

    def start(
        self, done: Callable[[list[dict[str, Any]] | None, BaseException | None], None]
    ) -> None:
        """Start; call ``done(records, error)`` exactly once, from any thread, when over."""

    def cancel(self) -> None:
        """Forcefully end every task (idempotent)."""

    def describe_error(self, error: BaseException) -> str:
        """A one-line explanation of a launch-level error (e.g. a Spark job failure)."""

    def failed_task(self, error: BaseException) -> Any:
        """The task (``index``, ``host``, ``executor``) a launch-level error names, or None."""
