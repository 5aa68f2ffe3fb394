"""Handles of operations in flight, and the names they hold while in flight.

As in Horovod, a ``name=`` belongs to one operation of a kind at a time on a rank: starting a
second ``allreduce_async(..., name="x")`` while the first's handle has not been synchronized
raises :class:`DuplicateNameError` at once, on that rank, before anything is sent. (Horovod
frees a name when its operation completes, which races with the call; here the name is held
until ``hvd.synchronize(handle)``, so the outcome does not depend on timing.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparktrain.errors import SparkTrainError

# (kind, name) -> the handle of the operation that holds the name.
_in_flight: dict[tuple[str, str], Handle] = {}


class DuplicateNameError(SparkTrainError, ValueError):
    """An operation was started under a name that another one in flight on this rank holds
    (a ``ValueError``, as in Horovod)."""


class Handle:
    """An operation in flight (what Horovod's ``*_async`` functions return).

    Args:
        work: torch.distributed's work object (None when nothing is in flight).
        finish: makes the result once ``work`` is done.
        error: raised by :meth:`wait` instead (an operation that could not start).
        key: the (kind, name) the operation holds until it completes.
    """

    def __init__(
        self,
        work: Any,
        finish: Callable[[], Any],
        error: BaseException | None = None,
        key: tuple[str, str] | None = None,
    ) -> None:
        self._work = work
        self._finish = finish
        self._error = error
        self._done = False
        self._result: Any = None
        self._key = key
        # Set while the operation waits for the other ranks (see matching.submit): settle
        # runs rounds until it has run, nudge runs one.
        self._settle: Callable[[], None] | None = None
        self._nudge: Callable[[], None] | None = None
        if key is not None:
            _in_flight[key] = self

    @classmethod
    def pending(cls, key: tuple[str, str] | None) -> Handle:
        """A handle for an operation that has not run yet (see :meth:`begin`)."""
        return cls(None, lambda: None, key=key)

    def settle_with(self, settle: Callable[[], None], nudge: Callable[[], None]) -> None:
        """How to wait for the operation to run (``settle``), or help it once (``nudge``)."""
        self._settle, self._nudge = settle, nudge

    def begin(self, work: Any, finish: Callable[[], Any]) -> None:
        """The operation has run: ``work`` is its transfer, ``finish`` makes the result."""
        self._work, self._finish = work, finish
        self._settle = self._nudge = None

    def refuse(self, error: BaseException) -> None:
        """The operation could not run: :meth:`wait` raises ``error``."""
        self._error = error
        self._settle = self._nudge = None

    @classmethod
    def failed(cls, error: BaseException) -> Handle:
        """A handle whose wait raises ``error``."""
        return cls(None, lambda: None, error)

    @property
    def refused(self) -> bool:
        """Whether the operation could not start (its wait raises)."""
        return self._error is not None

    def settle(self) -> None:
        """Wait until the operation has run or been refused (not for its transfer)."""
        if self._settle is not None:
            self._settle()

    def poll(self) -> bool:
        """Whether the operation has completed."""
        if self._nudge is not None:
            self._nudge()
        if self._settle is not None:
            return False
        return (
            self._done or self._error is not None or self._work is None or self._work.is_completed()
        )

    def wait(self) -> Any:
        """Wait for the operation and return its output.

        Raises:
            HorovodInternalError: when the ranks did not agree on the operation.
        """
        self.settle()
        if self._key is not None and _in_flight.get(self._key) is self:
            del _in_flight[self._key]
        if self._error is not None:
            raise self._error
        if not self._done:
            if self._work is not None:
                self._work.wait()
            self._result = self._finish()
            self._done = True
        return self._result


def claim(kind: str, name: str | None) -> tuple[str, str] | None:
    """The key an operation named ``name`` will hold, after checking that it is free.

    Raises:
        DuplicateNameError: when an operation of this kind, not yet synchronized, holds the
            name.
    """
    if name is None:
        return None
    key = (kind, name)
    if key in _in_flight:
        raise DuplicateNameError(
            f"hvd.{kind}: an operation named {name!r} is still in flight on this rank; give "
            "each concurrent operation its own name=, or hvd.synchronize() the first before "
            "starting the next"
        )
    return key


def forget_all() -> None:
    """Drop every name held (on shutdown: nothing is in flight after it)."""
    _in_flight.clear()
