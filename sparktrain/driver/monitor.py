"""The driver's side of a run: show logs, watch deadlines, stalls and failures, stop everything
cleanly, and say where each rank that was still running was stopped.

The monitor runs in the caller's thread (so a notebook cell shows the logs and Ctrl-C lands
here) and waits on one queue fed by the channel and by the launch's completion; it never
sleeps, and it wakes only to let a Ctrl-C through (see ``deadlines.SIGNAL_SLICE``).
"""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from sparktrain.config import RunConfig, conf_key
from sparktrain.driver import deadlines
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.deadlines import Deadlines, next_event
from sparktrain.driver.failures import rendezvous_timeout
from sparktrain.driver.hang import HangWatch
from sparktrain.driver.inflight import STOP as STOP_REQUEST
from sparktrain.driver.launch import Launch
from sparktrain.driver.layout import InterfaceVote
from sparktrain.driver.lines import LineView
from sparktrain.driver.result_intake import ResultReceiver
from sparktrain.driver.run_messages import RunMessages
from sparktrain.driver.stall import StallWatch
from sparktrain.errors import (
    RunTimeoutError,
    SparkTrainError,
    WorkerFailure,
)
from sparktrain.log import get_logger
from sparktrain.rank_outcome import RankOutcome
from sparktrain.task.process import STACK_WAIT
from sparktrain.wire import protocol

_log = get_logger(__name__)

DONE = "_done"
# Once ranks are told to stop, how long beyond their grace period to wait for them to confirm.
STOP_SLACK = 5.0
# After a forced cancel, how long to wait for the launch to report that it ended.
CANCEL_WAIT = 15.0
# After the launch ended, how long to wait for tasks' last messages (up to their "exited").
DRAIN_WAIT = 2.0


class RunMonitor(RunMessages):
    """Watches one launch attempt until it ends; returns the task records or raises.

    Args:
        config: the run's settings.
        server: the run's channel.
        out: where log lines go (the driver's stdout by default).
        on_report: called with each ``sparktrain.report`` message.
        kept_name: the name of rank 0's kept file (``rank0`` becomes each rank's) under
            which the results that reached the driver are kept when the run fails (and so
            returns none of them); None to let them go.
        all_ranks: every rank's value comes back (``run_all``), rather than rank 0's alone;
            by default, when ``kept_name`` is given.
        on_saved: told the step of each checkpoint rank 0 saves; what it returns (an
            elastic run's stop to grow) stops every rank.
    """

    def __init__(
        self,
        config: RunConfig,
        server: ChannelServer,
        out: TextIO | None = None,
        on_report: Callable[[dict[str, Any]], None] | None = None,
        kept_name: str | None = None,
        all_ranks: bool | None = None,
        on_saved: Callable[[int], SparkTrainError | None] | None = None,
    ) -> None:
        self.config = config
        self.on_saved = on_saved
        self.server = server
        self.out = out or sys.stdout
        self.on_report = on_report
        self.n = config.world_size
        self.arrived: set[int] = set()
        self.exited: set[int] = set()
        self.failures: dict[int, WorkerFailure] = {}
        # The ranks that were still running when the run was stopped: where each was.
        self.stopped: dict[int, WorkerFailure] = {}
        self.stall = StallWatch(config)
        self.hang = HangWatch(config)
        self.task_conns: dict[int, int] = {}
        self.started: dict[int, dict[str, Any]] = {}
        self.stop_reason: str | None = None
        self.stop_error: SparkTrainError | None = None
        # Whether the run's handle asked it to stop (see sparktrain.driver.inflight).
        self.stop_asked = False
        # Whether the launch was cancelled: from then on tasks may end without saying so.
        self.cancelled = False
        # Authenticated messages of an unknown kind or with missing or mistyped fields.
        self.malformed = 0
        # Whether the tasks were told to start their ranks (every task had arrived).
        self.go_sent = False
        # What each task said of itself at rendezvous (a TaskInfo as JSON), by index.
        self.infos: dict[int, dict[str, Any]] = {}
        # What each host's interface probes reached, when the ranks span hosts (from "go").
        self.vote: InterfaceVote | None = None
        # When each milestone was reached (time.monotonic()); see phases().
        self.times: dict[str, float] = {}
        # What the driver keeps of the results it received is named after it when the run
        # fails: a rank that finished as another failed keeps its value.
        self.kept_name = kept_name
        # Each task index's rank, once the layout is made.
        self.rank_of: dict[int, int] = {}
        every = kept_name is not None if all_ranks is None else all_ranks
        self.results = ResultReceiver(config.max_result_bytes, all_ranks=every)
        # When rank 0's launch reached each step, on its host (see task.records.launch_times).
        self.rank0_times: dict[str, Any] | None = None
        # The ranks' output, and the count of lines the tasks did not forward.
        self.lines = LineView(self._print)

    def _print(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except (OSError, ValueError):
            pass

    def watch(self, launch: Launch) -> list[RankOutcome]:
        """Start ``launch`` and see it through.

        Raises:
            WorkerFailedError: a rank failed (root cause first).
            RendezvousTimeoutError: some tasks never reached the rendezvous in time.
            RunTimeoutError: the run exceeded ``timeout``.
            KeyboardInterrupt: re-raised after every task has been stopped.
            concurrent.futures.CancelledError: the run's handle cancelled it; raised after
                every task has been stopped.

        Whatever else is raised while watching (SystemExit from a signal handler, say) is
        raised again once the launch is cancelled.
        """
        events = self.server.events
        launch.start(
            lambda records, error: events.put(
                (0, {"type": DONE, "records": records, "error": error})
            )
        )
        t0 = self.times["start"] = time.monotonic()
        try:
            done, interrupted = self._follow(launch, t0)
        except BaseException:
            # However else the watch ends (a second Ctrl-C, SystemExit from a signal handler,
            # a harness's time limit, MemoryError), the job must not outlive the call.
            launch.cancel()
            raise
        self.times["end"] = time.monotonic()
        self.lines.finish()
        return self._end(done, launch, interrupted)

    def _follow(self, launch: Launch, t0: float) -> tuple[dict[str, Any] | None, bool]:
        """Handle the run's events and deadlines until it has ended; returns the launch's
        "done" message (no records if it never confirmed its end) and whether Ctrl-C stopped
        it."""
        events = self.server.events
        # Detached tasks (a Connect client the executors cannot reach) never say hello: the
        # job alone tells how the run went, and Spark's barrier is their rendezvous.
        detached = bool(getattr(launch, "detached", False))
        timers = Deadlines()
        timers.set(deadlines.RENDEZVOUS, None if detached else t0 + self.config.start_timeout)
        timers.set(deadlines.RUN, t0 + self.config.timeout if self.config.timeout else None)
        done: dict[str, Any] | None = None
        interrupted = False
        while True:
            if done is not None and detached:
                break
            if done is not None and deadlines.DRAIN not in timers:
                self.times["done"] = time.monotonic()
                timers.set(deadlines.DRAIN, self.times["done"] + DRAIN_WAIT)
            # After a stop, the job may end before every task confirmed its ranks are gone
            # (a Spark cancel is asynchronous): keep listening for those confirmations. After
            # any end, a task's last messages (its final log lines) may still be on their way:
            # they come before its "exited", so wait a moment for that.
            draining = timers.ahead(deadlines.DRAIN, time.monotonic())
            # Tasks whose records came back have run, even if their hello is still on its way.
            expected = self.arrived | {r.get("index") for r in (done or {}).get("records") or ()}
            confirming = (deadlines.STOP in timers or draining) and not self.exited >= expected
            if done is not None and not confirming:
                break
            self._set_watches(timers)
            awaiting = len(self.arrived) < self.n and self.stop_reason is None
            skip = () if awaiting else (deadlines.RENDEZVOUS,)
            try:
                try:
                    conn_id, message = next_event(events, timers.wait(time.monotonic(), skip))
                except queue.Empty:  # a deadline passed
                    if self._on_deadline(timers, launch, done is None):
                        done = done or {"records": None, "error": None}
                        break
                else:
                    if message.get("type") == DONE:
                        done = message
                    else:
                        self._on_message(conn_id, message, timers, launch, done is None)
            except KeyboardInterrupt:
                if interrupted:
                    raise  # the caller cancels the launch at once
                interrupted = True
                _log.warning("interrupted; stopping every rank (Ctrl-C again to cancel at once)")
                timers.set(deadlines.STOP, self._stop(SparkTrainError("interrupted"), launch))
            if deadlines.STOP in timers and (self.exited >= self.arrived or not self.go_sent):
                # Every task has confirmed its ranks are gone, or the tasks were never told to
                # start any (they wait for "go", or in Spark's rendezvous): end the job now.
                timers.clear(deadlines.STOP)
                timers.set(deadlines.CANCEL, self._cancel(launch))
        return done, interrupted

    def _on_deadline(self, timers: Deadlines, launch: Launch, running: bool) -> bool:
        """A deadline passed: act on the first that is due. True: stop watching (the launch
        never confirmed its end after a cancel)."""
        now = time.monotonic()
        if timers.due(deadlines.CANCEL, now):
            if running:
                _log.warning(
                    "tasks did not confirm their end after cancellation; giving up on them"
                )
            return True
        if timers.due(deadlines.STOP, now):
            timers.clear(deadlines.STOP, deadlines.RUN)
            timers.set(deadlines.CANCEL, self._cancel(launch))
        elif (
            self.stop_reason is None
            and len(self.arrived) < self.n
            and timers.due(deadlines.RENDEZVOUS, now)
        ):
            timers.set(
                deadlines.STOP, self._stop(rendezvous_timeout(self.config, self.arrived), launch)
            )
        elif timers.due(deadlines.RUN, now):
            timers.clear(deadlines.RUN)
            error = RunTimeoutError(
                f"the run exceeded timeout={self.config.timeout:g}s "
                f"({conf_key('timeout')}); every rank was stopped"
            )
            timers.set(deadlines.STOP, self._stop(error, launch))
        elif (
            self.stop_reason is None
            and timers.due(deadlines.HANG, now)
            and (behind := self.hang.look(now))
        ):
            timers.set(deadlines.STOP, self._stop(self.hang.error(behind, self.started), launch))
        elif (
            self.stop_reason is None
            and timers.due(deadlines.STALL, now)
            and self.stall.stalled(now)
        ):
            timers.set(deadlines.STOP, self._stalled(launch))
        return False

    def _set_watches(self, timers: Deadlines) -> None:
        """The hang and stall watches' next looks (none once the run is stopping). While a
        rank waits in a collective, the stall watch waits for the hang watch's first look,
        which names the ranks behind when there are some."""
        running = self.stop_reason is None
        timers.set(deadlines.HANG, self.hang.deadline() if running else None)
        stall = self.stall.deadline() if running else None
        first_look = self.hang.first_look()
        if stall is not None and first_look is not None:
            stall = max(stall, first_look)
        timers.set(deadlines.STALL, stall)

    def _on_message(
        self,
        conn_id: int,
        message: dict[str, Any],
        timers: Deadlines,
        launch: Launch,
        running: bool,
    ) -> None:
        """A task's message, or the handle's stop: a stop it calls for goes out now."""
        if message.get("type") == STOP_REQUEST:
            # A run already ending (done, failed, timed out) ends as it would.
            if running and self.stop_reason is None:
                self.stop_asked = True
                _log.info("cancelled; stopping every rank")
                timers.set(deadlines.STOP, self._stop(SparkTrainError("cancelled"), launch))
            return
        stop = self._handle(conn_id, message)
        if stop is not None and self.stop_reason is None:
            timers.set(deadlines.STOP, self._stop(stop, launch))

    def _cancel(self, launch: Launch) -> float:
        """Cancel the launch; returns how long to wait for it to report its end."""
        self.cancelled = True
        launch.cancel()
        return time.monotonic() + CANCEL_WAIT

    def _stop(self, error: SparkTrainError | None, launch: Launch) -> float:
        """Ask every task to stop its ranks; returns the deadline for them to confirm."""
        self.stop_error = error
        self.stop_reason = str(error) if error else "stopping"
        self.server.broadcast(protocol.ABORT(reason=self.stop_reason), self._connections())
        # Each rank dumps its stack (STACK_WAIT at most), then gets the grace period.
        return time.monotonic() + STACK_WAIT + self.config.grace_period + STOP_SLACK

    def _stalled(self, launch: Launch) -> float | None:
        """The ranks have been silent too long: show where they are, or stop the run.

        Returns:
            The deadline for the tasks to confirm their stop, when the run is stopped.
        """
        if self.config.stall_action == "fail":
            return self._stop(self.stall.error(), launch)
        reason = self.stall.description()
        _log.warning("%s; asking every rank where it is", reason)
        self.server.broadcast(protocol.SHOW_STACKS(reason=reason), self._connections())
        return None
