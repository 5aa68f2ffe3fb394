"""The supervisor's end of a rank's stack pipe: ask for the rank's stack, wait for it.

The worker writes a header line once its dump handler is registered, then faulthandler's
dump of every thread each time it gets :data:`sparktrain.contract.STACK_SIGNAL` (see
``sparktrain.worker.bootstrap``). A reader thread collects what comes; :meth:`StackPipe.request`
signals the rank and waits, at most its timeout, until the main thread's part of the dump is
complete. A rank whose handler is not registered yet is never signalled (the signal's default
action would end it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from sparktrain import contract, stacks

# Most seconds to wait for a header the rank may already have written (see request).
HEADER_WAIT = 0.25
# What is kept of the pipe's text at most, in characters (a dump of 100 threads of 100
# frames each fits many times over).
MAX_KEPT = 4 << 20


class StackPipe:
    """Reads one rank's stack pipe in a thread of its own.

    Args:
        fd: the read end (owned from now on: closed at the pipe's end).
        name: the reader thread's name.
    """

    def __init__(self, fd: int, name: str) -> None:
        self._fd = fd
        self._cond = threading.Condition()
        self._text = ""
        self._header: tuple[int, str] | None = None
        self._header_read = False
        self._closed = False
        self._one_at_a_time = threading.Lock()
        threading.Thread(target=self._read, name=name, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                with self._cond:
                    self._text = (self._text + chunk.decode("utf-8", "replace"))[-MAX_KEPT:]
                    if not self._header_read and "\n" in self._text:
                        line, _, self._text = self._text.partition("\n")
                        self._header = contract.parse_stack_header(line)
                        self._header_read = True
                    self._cond.notify_all()
        finally:
            os.close(self._fd)
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    @property
    def ready(self) -> bool:
        """Whether the rank has registered its dump handler."""
        with self._cond:
            return self._header is not None and not self._closed

    def request(self, signal_rank: Callable[[], bool], timeout: float) -> stacks.Stack | None:
        """Have the rank dump its stacks; its main thread's stack, or None.

        Args:
            signal_rank: sends the rank the dump signal; False when the rank is gone.
            timeout: how long to wait for a complete dump (the partial one is returned then).

        Returns:
            None when the rank cannot answer (not registered yet, or gone) or wrote nothing
            of its main thread in time.
        """
        deadline = time.monotonic() + timeout
        if not self._one_at_a_time.acquire(timeout=timeout):
            return None
        try:
            with self._cond:
                # The header may be in the pipe, not yet read by the reader thread: the rank
                # wrote it before anything else it did (e.g. a line that made us ask).
                self._cond.wait_for(
                    lambda: self._header is not None or self._closed,
                    min(HEADER_WAIT, max(0.0, deadline - time.monotonic())),
                )
                if self._header is None or self._closed:
                    return None
                main, root = self._header
                self._text = ""  # earlier dumps are stale
            if not signal_rank():
                return None
            with self._cond:
                self._cond.wait_for(
                    lambda: self._closed or stacks.is_complete(self._text, main, root),
                    max(0.0, deadline - time.monotonic()),
                )
                return stacks.main_stack(self._text, main)
        finally:
            self._one_at_a_time.release()
