"""A run that does not block the notebook: ``runner.submit(...)`` returns a :class:`RunHandle`.

The run goes on in a thread of the driver. Its ranks' lines are kept in the handle (the last
:data:`KEPT_LINES`), not printed: a notebook prints a thread's output into whichever cell is
running at the time, so a run's lines would land in unrelated cells. ``handle.follow()``
prints them, live, in the cell that calls it.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import io
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import CANCELLED_AND_NOTIFIED, FINISHED
from typing import Any, TextIO, cast

from sparktrain.driver.inflight import Line, StopSignal, forget, next_ticket
from sparktrain.driver.interrupt import plain_ctrl_c
from sparktrain.driver.run_record import RunRecord

# The ranks' lines a handle keeps (the newest), so a long run's memory stays bounded.
KEPT_LINES = 10_000
# How long cancel() waits for the run to end by default: a stop asks the ranks to end (their
# stacks, then the grace period), then cancels the Spark job and waits for it.
CANCEL_WAIT = 120.0

# The handle of the run this thread is carrying out, while it does (see runner.submit).
# Handles whose runs are going, to stop at interpreter exit (a notebook kernel shut down).
_going: weakref.WeakSet[RunHandle] = weakref.WeakSet()
_going_lock = threading.Lock()
_exit_hook: list[bool] = []  # whether _at_exit is registered with atexit
# The SparkContexts runs went on, to stop cleanly at interpreter exit (weak: never kept alive).
_contexts: list[weakref.ref[Any]] = []


class RunHandle(Future[Any]):
    """A submitted run: a :class:`concurrent.futures.Future` of its result, and its output.

    ``result()``, ``done()``, ``add_done_callback()``, ``concurrent.futures.wait`` and
    ``as_completed`` work as for any Future. ``result()`` raises what ``run()`` would have
    raised (the same type and message); a cancelled run's raises ``CancelledError``.

    Attributes:
        name: the function's name.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.stop = StopSignal()
        self.record: RunRecord | None = None
        # The SparkSession active where the run was submitted (PySpark's is per thread).
        self.spark: Any = None
        self._lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._count = 0  # every line so far, kept or not
        self._new = threading.Condition()
        self._partial = ""
        self.output = cast(TextIO, _Output(self._write))
        # Its turn among the runs of this process: runs start in the order they were submitted.
        self.ticket = next_ticket()
        self._waiting: Line | None = None
        self._started = False  # whether it has its slots (or needs none) and launches

    def __repr__(self) -> str:
        return f"<RunHandle {self.name!r} {self.status()}, {self._count} lines>"

    def status(self) -> str:
        """Where the run is: ``starting``, waiting its turn (for what, and its place in
        line), ``running``, ``done``, ``failed`` or ``cancelled``.

        Example:
            >>> handles = [SparkRunner(np=2).submit(train, lr=lr) for lr in (0.01, 0.1)]
            >>> handles[1].status()
            "waiting for 2 task slots (other runs of this process hold 2 of the cluster's 2), 1st in line"
        """
        if self.cancelled():
            return "cancelled"
        if self.done():
            return "failed" if self.exception() is not None else "done"
        waiting = self._waiting
        if waiting is not None:
            return str(waiting)
        if not self._started:
            return "starting"
        record = self.record
        sizes = record.sizes if record is not None else []
        if record is not None and record.elastic is not None and sizes:
            ranks = "rank" if sizes[-1] == 1 else "ranks"
            return f"running on {sizes[-1]} {ranks} (np={record.elastic})"
        return "running"

    @property
    def sizes(self) -> list[int]:
        """Each attempt's number of ranks so far (an elastic run's changes of size).

        Example:
            >>> handle = SparkRunner(np=(2, 4)).submit(train)
            >>> handle.sizes
            [4, 2]
        """
        return list(self.record.sizes) if self.record is not None else []

    def _set_waiting(self, line: Line | None) -> None:
        """What the run waits for; None once it has its turn."""
        self._waiting = line
        self._started = line is None

    # -- the run's side -------------------------------------------------------------------

    def _write(self, text: str) -> None:
        with self._new:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            self._lines.extend(lines)
            self._count += len(lines)
            self._new.notify_all()

    def _carry_out(self, call: Callable[[], Any]) -> None:
        """Run ``call`` in this thread as this handle's run, and settle the Future with it."""
        try:
            if self.set_running_or_notify_cancel():
                self._carry_out_running(call)
        finally:
            forget(self.ticket)  # placed or not, it is no longer on its way

    def _carry_out_running(self, call: Callable[[], Any]) -> None:
        with _going_lock:
            _going.add(self)
            _register_exit_hook()
        try:
            value = call()
        except CancelledError:
            self._settle_cancelled()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self.set_exception(exc)
        else:
            self.set_result(value)
        finally:
            with _going_lock:
                _going.discard(self)
            with self._new:
                self._new.notify_all()

    def _settle_cancelled(self) -> None:
        # Future offers no public way from running to cancelled; this is what cancel() and
        # set_running_or_notify_cancel() do for a pending one (waiters, then callbacks).
        with self._condition:
            self._state = CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]

    # -- the user's side ------------------------------------------------------------------

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the run; its value (rank 0's, or every rank's for ``submit_all``).

        Ctrl-C (a kernel interrupt) while waiting stops the run, as during ``run()``, and
        raises KeyboardInterrupt; to wait without that risk, use ``follow()`` or
        ``concurrent.futures.wait``.

        Raises:
            TimeoutError: the run did not end within ``timeout`` seconds (it goes on).
            CancelledError: the run was cancelled.
            Exception: what the run raised (e.g. ``WorkerFailedError``), as ``run()`` would.
        """
        try:
            with plain_ctrl_c():
                return super().result(timeout)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def cancel(self, wait: float | None = CANCEL_WAIT) -> bool:
        """Stop the run, as Ctrl-C stops ``run()``: every rank ends, its Spark job is cancelled.

        Waits up to ``wait`` seconds for that (``None``: as long as it takes; 0: not at all).

        Returns:
            True when the run is (or is being) cancelled; False when it had already ended.
        """
        if super().cancel():  # not started yet
            return True
        if self.done():
            return self.cancelled()
        self.stop.request()
        if wait != 0:
            with contextlib.suppress(Exception):
                super().exception(wait)
        return self.cancelled() or not self.done()

    @property
    def last_run(self) -> RunRecord | None:
        """The run's record (attempts, phases, reports) once it has ended; None before."""
        return self.record if self.done() else None

    @property
    def progress(self) -> dict[int, dict[str, Any]]:
        """The newest ``sparktrain.report`` of each rank so far, by rank."""
        latest: dict[int, dict[str, Any]] = {}
        for row in list(self.record.reports) if self.record is not None else []:
            latest[int(row.get("rank", 0))] = row
        return dict(sorted(latest.items()))

    def logs(self) -> list[str]:
        """The ranks' lines so far, in order (``[rank N] ...``; the newest KEPT_LINES)."""
        with self._new:
            return list(self._lines)

    def tail(self, n: int = 20) -> list[str]:
        """The last ``n`` of the ranks' lines."""
        with self._new:
            return list(self._lines)[-n:] if n > 0 else []

    def follow(self, last: int = 10, out: TextIO | None = None) -> None:
        """Print the last ``last`` lines, then each new line as it comes, until the run ends.

        Ctrl-C (a kernel interrupt) stops following; the run goes on.

        Args:
            last: how many of the lines so far to print first.
            out: where to print (default: this cell's output, ``sys.stdout``).
        """
        with contextlib.suppress(KeyboardInterrupt), plain_ctrl_c():
            for line in self._lines_from(last):
                print(line, file=out or sys.stdout, flush=True)

    def _lines_from(self, last: int) -> Iterator[str]:
        """Yield the last ``last`` lines so far, then every new one until the run ends."""
        with self._new:
            position = max(0, self._count - max(0, last))
        while True:
            with self._new:
                while self._count == position and not self._ended():
                    self._new.wait()
                first_kept = self._count - len(self._lines)
                position = max(position, first_kept)
                batch = list(self._lines)[position - first_kept :]
                position = self._count
                ended = self._ended()
            yield from batch
            if ended and not batch:
                return

    def _ended(self) -> bool:
        return self._state in (FINISHED, CANCELLED_AND_NOTIFIED)


class _Output(io.TextIOBase):
    """What the run's monitor prints to: the text goes into the handle."""

    def __init__(self, write: Callable[[str], None]) -> None:
        super().__init__()
        self._sink = write

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._sink(text)
        return len(text)


def _register_exit_hook() -> None:
    """Register :func:`_at_exit` with atexit, once (the caller holds ``_going_lock``)."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_at_exit)


def stop_spark_at_exit(sc: Any) -> None:
    """Stop ``sc`` cleanly when the interpreter exits, after the runs still going.

    Without it, a script or a notebook kernel that ends without ``spark.stop()`` leaves the
    JVM to find its Python gone: it exits at once, and a local-cluster's master and workers,
    not told that the application ended, start new executors into the shutdown and print
    hundreds of lines of Java traces after the prompt has come back. A clean stop tells them
    first. Only SparkContexts that runs went on are stopped, and only at exit.
    """
    with _going_lock:
        if any(ref() is sc for ref in _contexts):
            return
        _contexts[:] = [ref for ref in _contexts if ref() is not None]
        _contexts.append(weakref.ref(sc))
        _register_exit_hook()


def _at_exit() -> None:
    """At interpreter exit: stop the runs still going, then the SparkContexts they ran on."""
    _stop_going_runs()
    with _going_lock:
        contexts = [sc for sc in (ref() for ref in _contexts) if sc is not None]
    for sc in contexts:
        if getattr(sc, "_jsc", None) is not None:  # not stopped already
            with contextlib.suppress(Exception):
                # The program has ended: what Spark's own shutdown races print now (an RPC
                # still in flight when an executor's connection closes) is nobody's concern.
                sc.setLogLevel("FATAL")
            with contextlib.suppress(Exception):
                sc.stop()


def _stop_going_runs() -> None:
    """At interpreter exit, stop the runs still going, so no rank outlives its notebook."""
    with _going_lock:
        going = list(_going)
    for handle in going:
        handle.stop.request()
    for handle in going:
        with contextlib.suppress(Exception):
            handle.exception(CANCEL_WAIT)
