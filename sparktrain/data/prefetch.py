"""A background thread that runs an iterator a few items ahead of its consumer."""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# How long closing waits for a thread that is inside a read or a user transform; past this it
# is left to finish on its own (it is a daemon thread and puts nothing more).
JOIN_TIMEOUT_S = 60.0


class Background(Iterator[T], Generic[T]):
    """Runs ``source`` in a daemon thread, at most ``depth`` items ahead of the consumer.

    Errors in the thread are raised to the consumer with their traceback. :meth:`close`
    stops the thread: it sets the stop flag and drains the queue, which releases a producer
    blocked on a full queue; the producer checks the flag before every put, so it puts at most
    once more and then ends.
    """

    def __init__(self, source: Iterator[T], depth: int, name: str) -> None:
        self._source = source
        self._queue: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: tuple[bool, Any]) -> bool:
        if self._stop.is_set():
            return False
        self._queue.put(item)
        return not self._stop.is_set()

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put((True, item)):
                    return
            self._put((False, StopIteration()))
        except BaseException as exc:  # handed to the consumer, who raises it
            self._put((False, exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        ok, item = self._queue.get()
        if ok:
            return item
        self.close()
        raise item

    def close(self) -> None:
        """Stop the thread and wait (bounded) for it to end."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if threading.current_thread() is not self._thread:
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                warnings.warn(
                    f"data loader thread {self._thread.name} is still busy after "
                    f"{JOIN_TIMEOUT_S:.0f} s (a slow read or transform); leaving it to end",
                    RuntimeWarning,
                    stacklevel=2,
                )
