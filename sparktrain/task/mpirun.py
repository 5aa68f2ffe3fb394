"""The task side of ``launcher="mpi"``: mpirun on rank 0's task, its daemons on the others.

Roles, all derived from the ClusterSpec every task computed identically:

* the *launcher* (the task of rank 0, or the local supervisor for ``np < 0``) runs
  ``mpirun`` under a guard, reads its tagged output back into per-rank lines, and builds the
  record of every rank once mpirun has ended (:func:`sparktrain.task.records.mpi_records`);
* a *daemon* task (local rank 0 on each other host) starts Open MPI's daemon when mpirun's
  agent asks (:mod:`sparktrain.task.rsh`), relays its exit code, and reports the error
  records its host's ranks wrote to the launcher;
* every other task only holds its slot (and its GPU) until the launcher releases it.

Non-launcher tasks keep one authenticated connection to the launcher's :class:`PeerServer`
(``member`` → ``daemon_started`` / ``host_done``; ``release`` comes back). The driver is
told of failures by the launcher, as the torch path's tasks do, and aborts every task the
usual way.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sparktrain import wire
from sparktrain.backends import mpi
from sparktrain.backends.base import Backend, rank_env
from sparktrain.cluster import ClusterSpec
from sparktrain.task.records import clip, mpi_records, read_errors
from sparktrain.task.rsh import PeerServer
from sparktrain.task.supervise import TAIL_LINES, RankProcess, stop_all
from sparktrain.task.supervisor import _Supervisor
from sparktrain.worker import context

MPIRUN = -1  # process key of mpirun
# mpirun and the daemons stop their ranks themselves (SIGTERM, grace, SIGKILL): they get that
# long and this much more before the supervisor kills them.
LAUNCHER_SLACK = 3.0
REAP_WAIT = 5.0
LAUNCHER_LINK = -2  # event id of a member task's connection to the launcher
# After mpirun ends: how long to wait for the other hosts' error records, beyond the grace.
HOST_REPORT_WAIT = 10.0


def uses_mpirun(launcher: str | None) -> bool:
    """Whether ranks are started by mpirun rather than one process per task."""
    return launcher == "mpi"


class MpiTask:
    """One task's part in an MPI run (see the module docstring).

    Args:
        supervisor: the task's supervisor (its events queue, channel and job).
        spec: the job's layout.
        backend: the run's backend (its ``env`` for MPI ranks).
        server: this task's peer server, listening on the port it offered at rendezvous.
        index: this task's partition index; ``None`` for the local supervisor, which
            launches and serves every host itself.
    """

    def __init__(
        self,
        supervisor: _Supervisor,
        spec: ClusterSpec,
        backend: Backend,
        server: PeerServer,
        index: int | None,
    ) -> None:
        self.sup = supervisor
        self.config = supervisor.config
        self.spec = spec
        self.backend = backend
        self.server = server
        self.local = index is None
        self.index = spec.ranks[0].task.index if index is None else index
        self.launches = self.index == spec.ranks[0].task.index
        daemon_hosts = mpi.hosts_needing_daemons(spec)
        self.serves = (
            set(daemon_hosts)
            if self.local
            else {h for h in daemon_hosts if mpi.first_task_on(spec, h) == self.index}
        )
        self.events = supervisor.events
        self.workdir = Path(".")
        # launcher state
        self.mpirun: RankProcess | None = None
        self.mpirun_code: int | None = None
        self.splitter = mpi.TagSplitter()
        self.tails: dict[int, collections.deque[str]] = {}
        self.own_lines: collections.deque[str] = collections.deque(maxlen=200)
        # The tasks that join the launcher (the local supervisor has none).
        self.expected = set() if self.local else {r.task.index for r in spec.ranks} - {self.index}
        self.joined: set[int] = set()
        self.members: set[int] = set()
        self.pending_hosts: set[str] = set()
        self.reports: dict[str, dict[str, Any]] = {}
        self.deadline: float | None = None
        # daemon / member state
        self.daemons: dict[int, tuple[str, RankProcess]] = {}
        self.link: wire.ChannelClient | None = None
        self.released = False
        self.stopping = False

    # -- environment --------------------------------------------------------------------

    def host_env(self, host: str) -> dict[str, str]:
        """The environment of mpirun or a daemon on ``host``, inherited by its ranks."""
        env = dict(os.environ)
        env.update(self.config.env)
        env.update(self.sup.common_env(self.workdir))
        table = {}
        for rank in self.spec.on_host(host):
            row = rank_env(self.spec, rank, self.config)
            row.update(self.backend.env(self.spec, rank, {}, self.config))
            row[context.USE_GPU_ENV] = "0" if row.get("CUDA_VISIBLE_DEVICES") == "" else "1"
            table[rank.rank] = row
        env[mpi.RANK_TABLE_ENV] = mpi.rank_table(table)
        env[mpi.OUTCOME_DIR_ENV] = str(self.workdir)
        return env

    def peers(self) -> dict[str, str]:
        """Which task serves each daemon host, for the agent."""
        peers = {}
        for host in mpi.hosts_needing_daemons(self.spec):
            if self.local:
                peers[host] = f"127.0.0.1:{self.server.port}"
            else:
                task = self.spec.on_host(host)[0].task
                peers[host] = f"{task.host}:{task.port}"
        return peers

    # -- life -----------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        """Play this task's role until the run is over; the launcher returns every record."""
        with self.sup.workdir() as workdir:
            self.workdir = workdir
            try:
                if self.launches:
                    self._start_mpirun()
                else:
                    self._join_launcher()
                self._loop()
                return self._records() if self.launches else []
            finally:
                stop_all([p for p in self._launchers() if p.proc.poll() is None], self.grace)
                for host, _ in self.spec.hosts():
                    self._reap(host)
                if self.link is not None:
                    self.link.close()

    def _launchers(self) -> list[RankProcess]:
        """mpirun and the daemons this task started (ended or not)."""
        procs = [p for _, p in self.daemons.values()]
        return procs if self.mpirun is None else [*procs, self.mpirun]

    def _guarded(
        self, key: int, command: list[str], env: dict[str, str], on_line: Callable[[int, str], None]
    ) -> RankProcess:
        """Start mpirun or a daemon under the guard that ties it to this task."""
        argv = [sys.executable, "-m", "sparktrain.task.guard", *command]
        return RankProcess(
            key, argv, env, str(self.workdir), on_line=on_line, on_exit=self.sup.on_exit
        )

    def _start_mpirun(self) -> None:
        first = self.spec.ranks[0]
        env = self.host_env(first.task.host)
        env[mpi.PEERS_ENV] = json.dumps(self.peers())
        command = mpi.mpirun_command(self.spec, grace_period=self.config.grace_period)
        self.mpirun = self._guarded(MPIRUN, command, env, self._on_mpirun_line)
        self.sup.started(first, self.mpirun.pid)

    def _join_launcher(self) -> None:
        task = self.spec.ranks[0].task
        try:
            link = wire.ChannelClient(
                f"{task.host}:{task.port}", self.sup.job.key, timeout=self.config.start_timeout
            )
            link.send({"type": "member", "index": self.index})
        except OSError:
            self.events.put(("peer_closed", LAUNCHER_LINK, None))
            return
        self.link = link

        def read() -> None:
            try:
                while True:
                    self.events.put(("peer", LAUNCHER_LINK, link.receive()))
            except (OSError, EOFError, wire.FrameError):
                if not link.closed:
                    self.events.put(("peer_closed", LAUNCHER_LINK, None))

        threading.Thread(target=read, name="sparktrain-mpi-link", daemon=True).start()

    def _finished(self) -> bool:
        if self.launches:
            if self.mpirun_code is None or any(
                p.proc.poll() is None for _, p in self.daemons.values()
            ):
                return False
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return True
            return not self.pending_hosts and (self.stopping or self.joined >= self.expected)
        return (self.released or self.stopping) and not self.daemons

    def _loop(self) -> None:
        while not self._finished():
            wait = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            try:
                kind, ident, value = self.events.get(timeout=wait)
            except queue.Empty:
                continue
            if kind == "abort":
                self._stop()
            elif kind == "exit":
                self._on_exit(ident, int(value))
            elif kind == "peer":
                self._on_peer(ident, value)
            elif kind == "peer_closed":
                self._on_peer_closed(ident)
        if self.launches:
            for conn_id in self.members:
                self.server.send(conn_id, {"type": "release"})

    def _stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        live = self._launchers()
        threading.Thread(target=stop_all, args=(live, self.grace), daemon=True).start()

    @property
    def grace(self) -> float:
        """How long mpirun or a daemon gets to stop its ranks before it is killed."""
        return self.config.grace_period + LAUNCHER_SLACK

    def _reap(self, host: str) -> None:
        """Make sure no rank of ``host`` started here outlives its launcher."""
        import psutil

        procs = []
        for rank in self.spec.on_host(host):
            path = self.workdir / f"rank-{rank.rank}.pid"
            try:
                proc = psutil.Process(int(path.read_text(encoding="utf-8")))
                if proc.create_time() <= path.stat().st_mtime + 1:
                    procs.append(proc)
            except (OSError, ValueError, psutil.Error):
                continue
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=REAP_WAIT)

    # -- events ---------------------------------------------------------------------------

    def _on_mpirun_line(self, _key: int, line: str) -> None:
        for rank, text in self.splitter.feed(line):
            self._rank_line(rank, text)

    def _rank_line(self, rank: int | None, text: str) -> None:
        if rank is None:
            self.own_lines.append(text)
            return
        self.tails.setdefault(rank, collections.deque(maxlen=TAIL_LINES)).append(text)
        if self.sup.forward_logs:
            self.sup.send({"type": "log", "rank": rank, "line": text})

    def _on_exit(self, key: int, code: int) -> None:
        if key == MPIRUN and self.mpirun is not None:
            self.mpirun.join()
            self._reap(self.spec.ranks[0].task.host)
            for rank, text in self.splitter.flush():
                self._rank_line(rank, text)
            self.mpirun_code = code
            grace = 0.0 if self.stopping else self.config.grace_period + HOST_REPORT_WAIT
            self.deadline = time.monotonic() + grace
            return
        host, proc = self.daemons.pop(key)
        proc.join()
        self._reap(host)
        self.server.send(key, {"type": "rsh_exit", "code": code})
        self._report(
            {
                "type": "host_done",
                "host": host,
                "code": code,
                "errors": {
                    str(r): e for r, e in read_errors(self.workdir, self.spec.on_host(host)).items()
                },
                "tail": clip(proc.tail),
            }
        )

    def _report(self, message: dict[str, Any]) -> None:
        """Tell the launcher about this task's daemon (itself, when it is the launcher)."""
        if self.launches:
            self._on_peer(0, message)
        elif self.link is not None:
            try:
                self.link.send(message)
            except OSError:
                pass

    def _on_peer(self, conn_id: int, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        if kind == "rsh":
            self._start_daemon(conn_id, str(message.get("host")), str(message.get("command")))
        elif kind == "release" and conn_id == LAUNCHER_LINK:
            self.released = True
        elif not self.launches:
            return
        elif kind == "member":
            self.joined.add(int(message.get("index", -1)))
            self.members.add(conn_id)
        elif kind == "daemon_started":
            if str(message.get("host")) not in self.reports:
                self.pending_hosts.add(str(message.get("host")))
        elif kind == "host_done":
            host = str(message.get("host"))
            self.reports[host] = dict(message)
            self.pending_hosts.discard(host)

    def _on_peer_closed(self, conn_id: int) -> None:
        if conn_id == LAUNCHER_LINK:
            self.released = True  # the launcher is gone: nothing more will come
            self._stop()
        elif conn_id in self.daemons:
            # mpirun dropped the agent: stop the daemon, as sshd does when a session drops.
            proc = self.daemons[conn_id][1]
            threading.Thread(target=proc.stop, args=(self.grace,), daemon=True).start()
        self.members.discard(conn_id)

    def _start_daemon(self, conn_id: int, host: str, command: str) -> None:
        started = {h for h, _ in self.daemons.values()} | set(self.reports)
        if self.stopping or host not in self.serves or host in started:
            why = "stopping" if self.stopping else f"this task does not serve {host!r}"
            self.server.send(conn_id, {"type": "rsh_output", "line": f"sparktrain: {why}"})
            self.server.send(conn_id, {"type": "rsh_exit", "code": 255})
            return

        def on_line(_key: int, line: str) -> None:
            self.server.send(conn_id, {"type": "rsh_output", "line": line})

        proc = self._guarded(conn_id, ["/bin/sh", "-c", command], self.host_env(host), on_line)
        self.daemons[conn_id] = (host, proc)
        self._report({"type": "daemon_started", "host": host})

    # -- outcome --------------------------------------------------------------------------

    def _records(self) -> list[dict[str, Any]]:
        assert self.mpirun is not None and self.mpirun_code is not None
        own = list(self.own_lines)
        exits = mpi.parse_exits(own)
        errors: dict[int, dict[str, Any]] = {}
        for report in self.reports.values():
            errors.update({int(r): e for r, e in report.get("errors", {}).items()})
            own.extend(report.get("tail", []))
        errors.update(read_errors(self.workdir, self.spec.on_host(self.spec.ranks[0].task.host)))
        records = mpi_records(
            self.spec,
            self.workdir,
            code=self.mpirun_code,
            stopped=self.mpirun.stopped_by_supervisor,
            end=self.mpirun.exit_time or time.time(),
            exits=exits,
            errors=errors,
            tails=self.tails,
            launcher_output=own,
        )
        for rec in records:
            if rec["status"] == "failed":
                self.sup.send({"type": "failure", "failure": rec["failure"]})
        return records
