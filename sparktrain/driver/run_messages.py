"""What a run's tasks tell the driver, and what the driver answers: the rendezvous (each task's
hello, then the layout once all have arrived), their lines and reports, the interface vote,
failures, lost connections and results.

:class:`RunMessages` is the part of :class:`~sparktrain.driver.monitor.RunMonitor` that reads
each message; the monitor owns the loop, the deadlines and the stop, and sets the attributes
declared here. A message that calls for the run to stop returns the error that says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sparktrain.config import RunConfig
from sparktrain.driver.channel import CLOSED, ChannelServer
from sparktrain.driver.hang import HangWatch
from sparktrain.driver.layout import InterfaceVote, layout_problem, plan_for
from sparktrain.driver.lines import LineView
from sparktrain.driver.outcome import RunOutcome
from sparktrain.driver.stall import StallWatch
from sparktrain.driver.validate import valid
from sparktrain.errors import (
    ConfigurationError,
    SparkTrainError,
    WorkerFailedError,
    WorkerFailure,
)
from sparktrain.layout.cluster import TaskInfo
from sparktrain.layout.rendezvous import go_messages
from sparktrain.log import get_logger
from sparktrain.wire import protocol

_log = get_logger(__name__)

# Messages that show the ranks are alive, for the stall watch.
_SIGNS_OF_LIFE = frozenset(
    {protocol.LOG, protocol.LOGS, protocol.USER_LOG, protocol.REPORT, protocol.ACTIVE}
)


class RunMessages(RunOutcome):
    """The tasks' messages to the driver, each read and answered (see the module's text)."""

    config: RunConfig
    server: ChannelServer
    n: int
    on_report: Callable[[dict[str, Any]], None] | None
    on_saved: Callable[[int], SparkTrainError | None] | None
    arrived: set[int]
    exited: set[int]
    task_conns: dict[int, int]
    stall: StallWatch
    hang: HangWatch
    cancelled: bool
    malformed: int
    go_sent: bool
    vote: InterfaceVote | None
    lines: LineView

    def _connections(self) -> list[int]:
        """Every task's connection, once (the local supervisor speaks for all its tasks on one)."""
        return sorted(set(self.task_conns.values()))

    def _handle(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """Read one message from connection ``conn_id``; returns the error that stops the run,
        where it calls for that."""
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
            self.hang.activity(message["rank"], time.monotonic())
        if kind is protocol.COLLECTIVES:
            self.hang.moved(message["counts"], time.monotonic())
        read = _READERS.get(kind)
        return None if read is None else read(self, conn_id, message)

    def _read_logs(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A batch of a rank's output lines."""
        self.lines.batch(message)
        return None

    def _read_log(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """One line of a rank's output."""
        self.lines.line(message["rank"], message["line"])
        return None

    def _read_user_log(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A line the user's function logged."""
        self.lines.line(message["rank"], message["message"])
        return None

    def _read_report(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A rank's report, for whoever asked for them."""
        if self.on_report is not None:
            self.on_report(message)
        return None

    def _read_saved(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A checkpoint saved: rank 0's, while the run goes on, may stop it (see ``on_saved``)."""
        if self.on_saved is not None and message["rank"] == 0 and self.stop_reason is None:
            return self.on_saved(message["step"])
        return None

    def _read_stack(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A rank's stacks: kept where the rank was stopped, shown where it still runs."""
        state = WorkerFailure.from_json(message["record"])
        if message["stopped"]:
            self.stopped.setdefault(state.rank, state)
        elif self.stop_reason is None:
            _log.warning("%s", state.describe(tail_lines=10))
        return None

    def _read_hello(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A task reached the rendezvous: once all have, the layout goes out."""
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
        return None

    def _read_probed(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A task's vote on the network interface: once chosen, every task is told."""
        vote = self.vote
        chosen = None if vote is None else vote.add(message["index"], message["reached"])
        if chosen is not None and chosen[0] is None:
            return ConfigurationError(str(chosen[1]))
        if chosen is not None:
            self.server.broadcast(protocol.CHOSEN(ifname=chosen[0]), self._connections())
        return None

    def _read_shared(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """What rank 0's task prepared (e.g. Horovod's rendezvous server), for every task."""
        self.server.broadcast(message, self._connections())
        return None

    def _read_started(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A rank's process started."""
        self.started[message["rank"]] = message
        return None

    def _read_failure(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A rank failed: the run stops, unless it only followed a stop (see ``_failed``)."""
        if self._failed(WorkerFailure.from_json(message["failure"])):
            return WorkerFailedError(self.failures)
        return None

    def _read_exited(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A task's ranks exited: its connection ending later loses nothing."""
        self.exited.add(message["index"])
        return None

    def _read_result_chunk(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A piece of a rank's result."""
        self.results.chunk(message)
        return None

    def _read_result_end(self, conn_id: int, message: dict[str, Any]) -> SparkTrainError | None:
        """A rank's result is whole: the task is told whether it was kept."""
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
        self.hang.start(self.times["go"], [rank.rank for rank in layout.spec.ranks])
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


# How the driver reads each kind of message; the others (ACTIVE, COLLECTIVES) only feed the
# stall and hang watches, in RunMessages._handle.
_READERS: dict[
    protocol.Kind, Callable[[RunMessages, int, dict[str, Any]], SparkTrainError | None]
] = {
    protocol.LOGS: RunMessages._read_logs,
    protocol.LOG: RunMessages._read_log,
    protocol.USER_LOG: RunMessages._read_user_log,
    protocol.REPORT: RunMessages._read_report,
    protocol.SAVED: RunMessages._read_saved,
    protocol.STACK: RunMessages._read_stack,
    protocol.HELLO: RunMessages._read_hello,
    protocol.PROBED: RunMessages._read_probed,
    protocol.SHARED: RunMessages._read_shared,
    protocol.STARTED: RunMessages._read_started,
    protocol.FAILURE: RunMessages._read_failure,
    protocol.EXITED: RunMessages._read_exited,
    protocol.RESULT_CHUNK: RunMessages._read_result_chunk,
    protocol.RESULT_END: RunMessages._read_result_end,
}
