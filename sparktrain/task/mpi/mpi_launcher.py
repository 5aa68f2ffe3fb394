"""The task side of ``launcher="mpi"``: one loop that plays this task's roles.

Roles, all derived from the ClusterSpec every task computed identically:

* the *launcher* (the task of rank 0, or the local supervisor for ``np < 0``) runs
  ``mpirun`` under a guard and builds the record of every rank once it has ended
  (:class:`~sparktrain.task.mpi.mpirun.Mpirun`);
* a *host* task (local rank 0 on each other host) starts Open MPI's daemon when mpirun's
  agent asks (:mod:`sparktrain.task.mpi.rsh`), relays its exit code, and reports the error
  records its host's ranks wrote to the launcher
  (:class:`~sparktrain.task.mpi.hosts.HostDaemons`);
* every other task only holds its slot (and its GPU) until the launcher releases it.

Non-launcher tasks keep one authenticated connection to the launcher's :class:`PeerServer`
(:class:`~sparktrain.task.mpi.hosts.LauncherLink`: ``member`` → ``daemon_started`` /
``host_done``; ``release`` comes back). The driver is told of failures by the launcher, as
the process launcher's tasks do, and aborts every task the usual way.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparktrain.backends.base import Backend
from sparktrain.layout.cluster import ClusterSpec
from sparktrain.rank_outcome import RankOutcome
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.mpi import command
from sparktrain.task.mpi.hosts import LAUNCHER_LINK, HostDaemons, LauncherLink
from sparktrain.task.mpi.mpirun import MPIRUN, Mpirun
from sparktrain.task.mpi.peers import PeerServer
from sparktrain.task.mpi.run import LAUNCHER_SLACK, MpiRun
from sparktrain.task.process import RankProcess, stop_all
from sparktrain.task.rank_launchers import Exchange, RankLauncher
from sparktrain.wire import protocol

if TYPE_CHECKING:
    pass


class MpiLauncher(RankLauncher):
    """mpirun creates the ranks: the launcher seam's MPI side (see the module docstring).

    The peer server starts with the launcher, so its port is what the task offers at
    rendezvous.
    """

    def __init__(self, session: TaskSession, bind: str) -> None:
        super().__init__(session, bind)
        events = session.events
        self.server = PeerServer(
            session.job.key,
            lambda kind, ident, message: events.put((kind, ident, message)),
            bind,
            tasks=session.job.tasks,
        )

    def port(self) -> int:
        return self.server.port

    def close(self) -> None:
        self.server.close()

    def run(
        self, spec: ClusterSpec, tasks: Sequence[int], backend: Backend, exchange: Exchange
    ) -> list[RankOutcome]:
        # The local supervisor holds every slot; a Spark task holds its own (one, or one
        # per GPU), all of one task.
        by_index = {r.task.index: r.task for r in spec.ranks}
        local = len({by_index[t].first_index for t in tasks}) > 1
        index = spec.first.task.index if local else by_index[tasks[0]].first_index
        return MpiTask(MpiRun(self.session, spec, backend, self.server, local), index).run()


class MpiTask:
    """One task's part in an MPI run: its roles, and the loop that feeds them events.

    Args:
        run: what the roles share.
        index: this task's partition index (the launcher's, for the local supervisor).
    """

    def __init__(self, run: MpiRun, index: int) -> None:
        self.run_ = run
        self.spec = run.spec
        self.events = run.session.events
        self.index = index
        self.launcher = Mpirun(run, index) if index == self.spec.first.task.index else None
        self.hosts = HostDaemons(run, index, report=self._report)
        self.link: LauncherLink | None = None
        # Authenticated messages that were not of a kind this task accepts, or malformed.
        self.malformed = 0

    def run(self) -> list[RankOutcome]:
        """Play this task's roles until the run is over; the launcher returns every record."""
        run = self.run_
        with run.session.workdir() as workdir:
            run.workdir = workdir
            try:
                if self.launcher is not None:
                    self.launcher.start()
                else:
                    self.link = LauncherLink.join(run, self.index)
                self._loop()
                return self.launcher.records() if self.launcher is not None else []
            finally:
                stop_all([p for p in self._processes() if p.proc.poll() is None], run.grace)
                for host, _ in self.spec.hosts():
                    run.reap(host)
                if self.link is not None:
                    self.link.close()

    def _processes(self) -> list[RankProcess]:
        """mpirun and the daemons this task started (ended or not)."""
        procs = self.hosts.processes()
        if self.launcher is not None and self.launcher.proc is not None:
            procs.append(self.launcher.proc)
        return procs

    def _finished(self) -> bool:
        if self.launcher is not None:
            return not self.hosts.running() and self.launcher.finished()
        released = self.link is None or self.link.released
        return (released or self.run_.stopping) and not self.hosts.daemons

    def _loop(self) -> None:
        while not self._finished():
            deadline = self.launcher.deadline if self.launcher is not None else None
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                kind, ident, value = self.events.get(timeout=wait)
            except queue.Empty:
                continue
            if kind == "abort":
                self._stop()
            elif kind == "exit" and ident == MPIRUN and self.launcher is not None:
                self.launcher.on_exit(int(value))
            elif kind == "exit":
                self.hosts.on_exit(ident, int(value))
            elif kind == "peer":
                self._on_peer(ident, value)
            elif kind == "peer_closed":
                self._on_peer_closed(ident)
        if self.launcher is not None:
            self.launcher.release_members()

    def _stop(self) -> None:
        if self.run_.stopping:
            return
        self.run_.stopping = True
        live = self._processes()
        run = self.run_

        def stop() -> None:
            # The ranks first, with their grace period; then mpirun and the daemons, which
            # end on their own once their ranks are gone.
            run.terminate(run.config.grace_period)
            stop_all(live, LAUNCHER_SLACK + 2 * command.KILL_STEP)

        threading.Thread(target=stop, daemon=True).start()

    def _report(self, message: dict[str, Any]) -> None:
        """Tell the launcher about this task's daemon (itself, when it is the launcher)."""
        if self.launcher is not None:
            kind = protocol.parse(message, protocol.TO_PEER)
            assert kind is not None, message
            self.launcher.on_peer(0, kind, message)
        elif self.link is not None:
            self.link.send(message)

    def _on_peer(self, conn_id: int, message: dict[str, Any]) -> None:
        accepted = protocol.TO_MEMBER if conn_id == LAUNCHER_LINK else protocol.TO_PEER
        kind = protocol.parse(message, accepted)
        if kind is None:
            self.malformed += 1
        elif kind is protocol.RSH:
            self.hosts.start(conn_id, message["host"], message["command"])
        elif kind is protocol.RELEASE and self.link is not None:
            self.link.released = True
        elif self.launcher is not None:
            self.launcher.on_peer(conn_id, kind, message)

    def _on_peer_closed(self, conn_id: int) -> None:
        if conn_id == LAUNCHER_LINK:
            if self.link is not None:
                self.link.released = True  # the launcher is gone: nothing more will come
            self._stop()
        else:
            self.hosts.on_closed(conn_id)
        if self.launcher is not None:
            self.launcher.members.discard(conn_id)
