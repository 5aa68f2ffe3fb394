"""The driver's side of a run: show logs, watch deadlines, stalls and failures, stop everything
cleanly, and say where each rank that was still running was stopped.

The monitor runs in the caller's thread (so a notebook cell shows the logs and Ctrl-C lands
here) and waits on one queue fed by the channel and by the launch's completion; it never
sleeps, and it wakes only to let a Ctrl-C through (see ``SIGNAL_SLICE``).
"""

from __future__ import annotations

import math
import queue
import sys
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any, TextIO

from sparktrain.config import RunConfig, conf_key
from sparktrain.driver.channel import CLOSED, ChannelServer
from sparktrain.driver.failures import job_failure, rendezvous_timeout
from sparktrain.driver.inflight import STOP
from sparktrain.driver.launch import Launch
from sparktrain.driver.layout import InterfaceVote, layout_problem, plan_for
from sparktrain.driver.lines import LineView
from sparktrain.driver.result_intake import ResultReceiver
from sparktrain.driver.stall import StallWatch
from sparktrain.driver.validate import valid
from sparktrain.errors import (
    ConfigurationError,
    RunTimeoutError,
    SparkTrainError,
    WorkerFailedError,
    WorkerFailure,
    describe_stopped,
)
from sparktrain.layout.cluster import TaskInfo
from sparktrain.layout.rendezvous import go_messages
from sparktrain.log import get_logger
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
# Messages that show the ranks are alive, for the stall watch.
_SIGNS_OF_LIFE = frozenset(
    {protocol.LOG, protocol.LOGS, protocol.USER_LOG, protocol.REPORT, protocol.ACTIVE}
)


# A signal the kernel hands to another thread of this process (any thread may take a
# process-directed SIGINT, e.g. when the main thread already has a signal pending) only sets
# Python's flag: a main thread blocked on a lock is not woken, and the handler (Ctrl-C's
# KeyboardInterrupt) runs only once it is back in the interpreter. So the wait is cut in slices.
SIGNAL_SLICE = 0.25


def _next_event(events: queue.Queue[Any], wait: float | None) -> Any:
    """Return the next event, or raise ``queue.Empty`` once ``wait`` seconds passed (never, for
    None), waking every ``SIGNAL_SLICE`` seconds so that a pending Ctrl-C is raised at once."""
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        left = SIGNAL_SLICE if deadline is None else deadline - time.monotonic()
        try:
            return events.get(timeout=max(0.0, min(SIGNAL_SLICE, left)))
        except queue.Empty:
            if deadline is not None and time.monotonic() >= deadline:
                raise


class RunMonitor:
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
        self.task_conns: dict[int, int] = {}
        self.started: dict[int, dict[str, Any]] = {}
        self.stop_reason: str | None = None
        self.stop_error: SparkTrainError | None = None
        # Whether on_saved stopped the ranks after a checkpoint: the run goes on in a launch
        # of another size, so what these ranks returned is nobody's result and is not kept.
        self.superseded = False
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

    def watch(self, launch: Launch) -> list[dict[str, Any]]:
        """Start ``launch`` and see it through.

        Raises:
            WorkerFailedError: a rank failed (root cause first).
            RendezvousTimeoutError: some tasks never reached the rendezvous in time.
            RunTimeoutError: the run exceeded ``timeout``.
            KeyboardInterrupt: re-raised after every task has been stopped.
            concurrent.futures.CancelledError: the run's handle cancelled it; raised after
                every task has been stopped.
        """
        events = self.server.events
        launch.start(
            lambda records, error: events.put(
                (0, {"type": DONE, "records": records, "error": error})
            )
        )
        t0 = self.times["start"] = time.monotonic()
        # Detached tasks (a Connect client the executors cannot reach) never say hello: the
        # job alone tells how the run went, and Spark's barrier is their rendezvous.
        detached = bool(getattr(launch, "detached", False))
        rendezvous_deadline = math.inf if detached else t0 + self.config.start_timeout
        run_deadline = t0 + self.config.timeout if self.config.timeout else None
        stop_deadline: float | None = None
        cancel_deadline: float | None = None
        done: dict[str, Any] | None = None
        drain_deadline: float | None = None
        interrupted = False
        # Whether the run's handle asked it to stop (see sparktrain.driver.inflight).
        stop_asked = False
        while True:
            if done is not None and detached:
                break
            if done is not None and drain_deadline is None:
                self.times["done"] = time.monotonic()
                drain_deadline = self.times["done"] + DRAIN_WAIT
            # After a stop, the job may end before every task confirmed its ranks are gone
            # (a Spark cancel is asynchronous): keep listening for those confirmations. After
            # any end, a task's last messages (its final log lines) may still be on their way:
            # they come before its "exited", so wait a moment for that.
            draining = drain_deadline is not None and time.monotonic() < drain_deadline
            # Tasks whose records came back have run, even if their hello is still on its way.
            expected = self.arrived | {r.get("index") for r in (done or {}).get("records") or ()}
            confirming = (stop_deadline is not None or draining) and not self.exited >= expected
            if done is not None and not confirming:
                break
            stall_deadline = self.stall.deadline() if self.stop_reason is None else None
            timers = (run_deadline, stop_deadline, cancel_deadline, drain_deadline, stall_deadline)
            deadlines = [d for d in timers if d is not None]
            if len(self.arrived) < self.n and self.stop_reason is None and not detached:
                deadlines.append(rendezvous_deadline)
            wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            try:
                try:
                    conn_id, message = _next_event(events, wait)
                except queue.Empty:  # a deadline passed
                    now = time.monotonic()
                    if cancel_deadline is not None and now >= cancel_deadline:
                        if done is None:
                            _log.warning(
                                "tasks did not confirm their end after cancellation; "
                                "giving up on them"
                            )
                        done = done or {"records": None, "error": None}
                        break
                    if stop_deadline is not None and now >= stop_deadline:
                        stop_deadline, cancel_deadline = None, self._cancel(launch)
                        run_deadline = None
                    elif (
                        self.stop_reason is None
                        and len(self.arrived) < self.n
                        and (now >= rendezvous_deadline)
                    ):
                        stop_deadline = self._stop(
                            rendezvous_timeout(self.config, self.arrived), launch
                        )
                    elif run_deadline is not None and now >= run_deadline:
                        run_deadline = None
                        stop_deadline = self._stop(
                            RunTimeoutError(
                                f"the run exceeded timeout={self.config.timeout:g}s "
                                f"({conf_key('timeout')}); every rank was stopped"
                            ),
                            launch,
                        )
                    elif self.stop_reason is None and self.stall.stalled(now):
                        stop_deadline = self._stalled(launch)
                else:
                    if message.get("type") == DONE:
                        done = message
                    elif message.get("type") == STOP:
                        # A run already ending (done, failed, timed out) ends as it would.
                        if done is None and self.stop_reason is None:
                            stop_asked = True
                            _log.info("cancelled; stopping every rank")
                            stop_deadline = self._stop(SparkTrainError("cancelled"), launch)
                    else:
                        stop = self._handle(conn_id, message)
                        if stop is not None and self.stop_reason is None:
                            stop_deadline = self._stop(stop, launch)
            except KeyboardInterrupt:
                if interrupted:
                    launch.cancel()
                    raise
                interrupted = True
                _log.warning("interrupted; stopping every rank (Ctrl-C again to cancel at once)")
                stop_deadline = self._stop(SparkTrainError("interrupted"), launch)
            if stop_deadline is not None and (self.exited >= self.arrived or not self.go_sent):
                # Every task has confirmed its ranks are gone, or the tasks were never told to
                # start any (they wait for "go", or in Spark's rendezvous): end the job now.
                stop_deadline, cancel_deadline = None, self._cancel(launch)
        self.times["end"] = time.monotonic()
        self.lines.finish()
        if interrupted or stop_asked:
            self._keep_results(say=True)
        if interrupted:
            self._collect_stopped(done)
            if self.stopped:
                report = describe_stopped(self.stopped)
                raise KeyboardInterrupt(f"interrupted; every rank was stopped.\n\n{report}")
            raise KeyboardInterrupt
        if stop_asked:
            self._collect_stopped(done)
            note = f"\n\n{describe_stopped(self.stopped)}" if self.stopped else ""
            raise CancelledError(f"cancelled; every rank was stopped.{note}")
        return self._conclude(done, launch)

    def phases(self) -> dict[str, float]:
        """Seconds from launch to the first hello (``submit``), to every task's
        (``rendezvous``), to the launch's end (``training``) and to the monitor's
        (``teardown``); phases never reached are left out."""
        marks = [("submit", "hello"), ("rendezvous", "go"), ("training", "done")]
        spent: dict[str, float] = {}
        last = self.times.get("start")
        for phase, mark in marks:
            if last is None or mark not in self.times:
                break
            spent[phase] = self.times[mark] - last
            last = self.times[mark]
        if "done" in self.times and "end" in self.times:
            spent["teardown"] = self.times["end"] - self.times["done"]
        return spent

    def _connections(self) -> list[int]:
        """Every task's connection, once (the local supervisor speaks for all its tasks on one)."""
        return sorted(set(self.task_conns.values()))

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

    def _failed(self, failure: WorkerFailure) -> bool:
        """Count ``failure``; False when it only followed a stop for a deadline, a stall or
        an interrupt (its collective lost a peer that was stopped): it then counts as stopped."""
        stopping = self.stop_reason is not None and not isinstance(
            self.stop_error, WorkerFailedError
        )
        if stopping and failure.follows_peer_loss:
            self.stopped.setdefault(failure.rank, failure)
            return False
        self.failures.setdefault(failure.rank, failure)
        return True

    def _collect_stopped(self, done: dict[str, Any] | None) -> None:
        """Take the stopped ranks' stacks from the records too (they may come either way)."""
        for record in (done or {}).get("records") or ():
            if record.get("status") == "stopped" and record.get("failure"):
                try:
                    failure = WorkerFailure.from_json(record["failure"])
                except (TypeError, ValueError):
                    continue
                self.stopped.setdefault(failure.rank, failure)

    def _handle(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        if message.get("type") == CLOSED:
            return self._closed(conn_id)
        kind = protocol.parse(message, protocol.TO_DRIVER)
        if kind is None or not valid(kind, message, self.n):
            # Authenticated, so from a holder of the run's key, but not a message we know:
            # a version mismatch or a bug, never a reason to end the run.
            self.malformed += 1
            return None
        if kind in _SIGNS_OF_LIFE:
            self.stall.activity(time.monotonic())
        if kind is protocol.LOGS:
            self.lines.batch(message)
        elif kind is protocol.LOG:
            self.lines.line(message["rank"], message["line"])
        elif kind is protocol.USER_LOG:
            self.lines.line(message["rank"], message["message"])
        elif kind is protocol.REPORT:
            if self.on_report is not None:
                self.on_report(message)
        elif kind is protocol.SAVED:
            if self.on_saved is not None and message["rank"] == 0 and self.stop_reason is None:
                stop = self.on_saved(message["step"])
                self.superseded = stop is not None
                return stop
        elif kind is protocol.STACK:
            state = WorkerFailure.from_json(message["record"])
            if message["stopped"]:
                self.stopped.setdefault(state.rank, state)
            elif self.stop_reason is None:
                _log.warning("%s", state.describe(tail_lines=10))
        elif kind is protocol.HELLO:
            index = message["index"]
            self.times.setdefault("hello", time.monotonic())
            self.arrived.add(index)
            self.task_conns.setdefault(index, conn_id)
            self.infos.setdefault(index, message["info"])
            if self.stop_reason is not None:
                # It arrived after the stop went out: it must not start its ranks either.
                self.server.send(conn_id, protocol.ABORT(reason=self.stop_reason))
            elif len(self.arrived) == self.n and not self.go_sent:
                return self._go()
        elif kind is protocol.PROBED:
            vote = self.vote
            chosen = None if vote is None else vote.add(message["index"], message["reached"])
            if chosen is not None and chosen[0] is None:
                return ConfigurationError(str(chosen[1]))
            if chosen is not None:
                self.server.broadcast(protocol.CHOSEN(ifname=chosen[0]), self._connections())
        elif kind is protocol.SHARED:
            # What rank 0's task prepared (e.g. Horovod's rendezvous server), for every task.
            self.server.broadcast(message, self._connections())
        elif kind is protocol.STARTED:
            self.started[message["rank"]] = message
        elif kind is protocol.FAILURE:
            if self._failed(WorkerFailure.from_json(message["failure"])):
                return WorkerFailedError(self.failures)
        elif kind is protocol.EXITED:
            self.exited.add(message["index"])
        elif kind is protocol.RESULT_CHUNK:
            self.results.chunk(message)
        elif kind is protocol.RESULT_END:
            error = self.results.end(message)
            self.server.send(conn_id, protocol.RESULT_SAVED(ok=error is None, error=error or ""))
        return None

    def _go(self) -> SparkTrainError | None:
        """Every task has arrived: map them to ranks once, and send each connection its tasks'
        part of the layout (see :mod:`sparktrain.layout.rendezvous`); or refuse the layout."""
        # By index, not arrival: a message names the tasks in a stable order.
        tasks = [TaskInfo.from_json(self.infos[i]) for i in range(self.n)]
        layout = plan_for(tasks, self.config)
        problem = layout_problem(tasks, self.config, layout.spec)
        if problem is not None:
            return ConfigurationError(problem)
        # From here on a task may start ranks; before it, none can have.
        self.go_sent = True
        self.rank_of = {rank.task.index: rank.rank for rank in layout.spec.ranks}
        self.times["go"] = time.monotonic()
        self.stall.start(self.times["go"])
        self.vote = InterfaceVote(layout, self.config.nics)
        slots: dict[int, list[int]] = {}
        for index, conn in sorted(self.task_conns.items()):
            slots.setdefault(conn, []).append(index)
        for conn, indices in slots.items():
            for message in go_messages(layout, indices):
                self.server.send(conn, message)
        return None

    def _closed(self, conn_id: int) -> SparkTrainError | None:
        """A task's connection ended: unless it said its ranks exited, they are lost.

        Also while a failure is being stopped, until the launch is cancelled: a task that
        vanished then (its executor killed) is why its peers' collectives failed, though
        their errors may have come first."""
        lost = [i for i, c in self.task_conns.items() if c == conn_id and i not in self.exited]
        for_failure = isinstance(self.stop_error, WorkerFailedError) and not self.cancelled
        for index in lost:
            self.exited.add(index)
            if self.stop_reason is None or for_failure:
                ranks = [r for r, m in self.started.items() if m.get("index") == index]
                failure = WorkerFailure(
                    rank=ranks[0] if ranks else index,
                    host=str(self.infos.get(index, {}).get("host") or ""),
                    phase="lost",
                    time=time.time(),
                    message="its Spark task vanished (executor lost or Python worker "
                    "killed) before the rank finished",
                )
                self.failures.setdefault(failure.rank, failure)
                return WorkerFailedError(self.failures)
        return None

    def _keep_results(self, say: bool = False) -> str:
        """Keep the results that reached the driver of a run that returns none of them (a rank
        that finished as another failed, or as the run was stopped); what the error says of
        them (empty when none arrived), or with ``say``, a warning says it. Nothing is kept
        of ranks stopped at a checkpoint to launch the run at another size (``on_saved``)."""
        if self.kept_name is None or self.superseded:
            return ""
        kept = self.results.keep(self.rank_of, self.kept_name)
        if kept and say:
            _log.warning("the run returns no value%s", kept)
        return kept

    def _conclude(self, done: dict[str, Any], launch: Launch) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = done.get("records") or []
        self.rank0_times = next((r.get("times") for r in records if r.get("rank") == 0), None)
        self.results.attach(records)
        for record in records:
            if record.get("status") == "failed" and record.get("failure"):
                self._failed(WorkerFailure.from_json(record["failure"]))
        self._collect_stopped(done)
        if self.failures:
            kept = self._keep_results()
            raise WorkerFailedError(self.failures, kept, stopped=self.stopped)
        if self.stop_error is not None or done.get("error") is not None:
            self._keep_results(say=True)
        if isinstance(self.stop_error, RunTimeoutError):
            # Raised with where every rank was, which is known only now.
            raise type(self.stop_error)(self.stop_error.reason, self.stopped)
        if self.stop_error is not None:
            raise self.stop_error
        error = done.get("error")
        if error is not None:
            failure = job_failure(
                launch.describe_error(error), launch.failed_task(error), self.started, self.infos
            )
            raise WorkerFailedError({failure.rank: failure}) from error
        return records
