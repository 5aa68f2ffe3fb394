"""The launcher role of an MPI run: mpirun on rank 0's task, and every rank's record after it.

mpirun runs under the guard (:mod:`sparktrain.task.mpi.guard`) with ``--tag-output``; its
output is split back into per-rank lines for the driver. Once it has ended, the launcher waits
(within a bound) for every other host's report of the error records its ranks wrote, and
builds the records of all ranks (:func:`sparktrain.task.rank_outcomes.mpi_records`).
"""

from __future__ import annotations

import collections
import json
import time
from typing import TYPE_CHECKING, Any

from sparktrain import contract
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.task.mpi import command
from sparktrain.task.mpi.run import MpiRun
from sparktrain.task.process import TAIL_LINES, RankProcess
from sparktrain.task.rank_outcomes import mpi_records, read_errors
from sparktrain.wire import protocol

if TYPE_CHECKING:
    from collections.abc import Mapping


MPIRUN = -1  # process key of mpirun
# After mpirun ends: how long to wait for the other hosts' error records, beyond the grace.
HOST_REPORT_WAIT = 10.0


class Mpirun:
    """Runs mpirun for the whole job and collects what the other tasks report.

    Args:
        run: what this task's roles share.
        index: this task's partition index.
    """

    def __init__(self, run: MpiRun, index: int) -> None:
        self.run = run
        self.spec = run.spec
        self.proc: RankProcess | None = None
        self.code: int | None = None
        self.splitter = command.TagSplitter()
        self.tails: dict[int, collections.deque[str]] = {}
        self.own_lines: collections.deque[str] = collections.deque(maxlen=200)
        # The tasks that join the launcher (the local supervisor has none), by first slot.
        tasks = {r.task.first_index for r in self.spec.ranks}
        self.expected = set() if run.local else tasks - {index}
        self.joined: set[int] = set()
        self.members: set[int] = set()
        self.pending_hosts: set[str] = set()
        self.reports: dict[str, dict[str, Any]] = {}
        self.deadline: float | None = None

    def peers(self) -> dict[str, str]:
        """Which task serves each daemon host, for the agent."""
        peers = {}
        for host in command.hosts_needing_daemons(self.spec):
            if self.run.local:
                peers[host] = f"127.0.0.1:{self.run.server.port}"
            else:
                task = self.spec.on_host(host)[0].task
                peers[host] = f"{task.host}:{task.port}"
        return peers

    def start(self) -> None:
        """Start mpirun for every rank of the job."""
        first = self.spec.first
        env = self.run.host_env(first.task.host)
        env[contract.RSH_PEERS_ENV] = json.dumps(self.peers())
        argv = command.mpirun_command(self.spec, extra=self.run.config.extra_mpi_args or ())
        self.proc = self.run.guarded(MPIRUN, argv, env, self._on_line)
        self.run.session.started(first, self.proc.pid)

    def finished(self) -> bool:
        """Whether mpirun has ended and every report came (or stopped being waited for)."""
        if self.code is None:
            return False
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        return not self.pending_hosts and (self.run.stopping or self.joined >= self.expected)

    def _on_line(self, _key: int, line: str) -> None:
        for rank, text in self.splitter.feed(line):
            self._rank_line(rank, text)

    def _rank_line(self, rank: int | None, text: str) -> None:
        if rank is None:
            self.own_lines.append(text)
            return
        self.tails.setdefault(rank, collections.deque(maxlen=TAIL_LINES)).append(text)
        self.run.session.log(rank, text)

    def on_exit(self, code: int) -> None:
        """mpirun has ended with ``code``."""
        assert self.proc is not None
        self.proc.join()
        self.run.reap(self.spec.first.task.host)
        for rank, text in self.splitter.flush():
            self._rank_line(rank, text)
        self.code = code
        grace = 0.0 if self.run.stopping else self.run.config.grace_period + HOST_REPORT_WAIT
        self.deadline = time.monotonic() + grace

    def on_peer(self, conn_id: int, kind: protocol.Kind, message: Mapping[str, Any]) -> None:
        """A message from another task of the run (or this task's own host role)."""
        if kind is protocol.MEMBER:
            self.joined.add(message["index"])
            self.members.add(conn_id)
        elif kind is protocol.DAEMON_STARTED:
            if message["host"] not in self.reports:
                self.pending_hosts.add(message["host"])
        elif kind is protocol.HOST_DONE:
            host = message["host"]
            self.reports[host] = dict(message)
            self.pending_hosts.discard(host)

    def release_members(self) -> None:
        """Let the other tasks go: the run is over."""
        for conn_id in self.members:
            self.run.server.send(conn_id, protocol.RELEASE())

    def records(self) -> list[RankOutcome]:
        """Every rank's record; failures are sent to the driver too."""
        assert self.proc is not None and self.code is not None
        own = list(self.own_lines)
        exits = command.parse_exits(own)
        errors: dict[int, dict[str, Any]] = {}
        for report in self.reports.values():
            errors.update({int(r): e for r, e in report.get("errors", {}).items()})
            own.extend(report.get("tail", []))
        first_host = self.spec.first.task.host
        errors.update(read_errors(self.run.workdir, self.spec.on_host(first_host)))
        records = mpi_records(
            self.spec,
            self.run.workdir,
            code=self.code,
            # Ranks this task stopped (the driver's abort) end on SIGTERM: not a root cause.
            stopped=self.proc.stopped_by_supervisor or self.run.stopping,
            end=self.proc.exit_time or time.time(),
            exits=exits,
            errors=errors,
            tails=self.tails,
            launcher_output=own,
        )
        for rec in records:
            if rec.status is RankStatus.FAILED and rec.failure is not None:
                self.run.session.send(protocol.FAILURE(failure=rec.failure.to_json()))
        return records
