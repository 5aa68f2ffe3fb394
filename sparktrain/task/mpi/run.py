"""What every role of one MPI task shares (:class:`MpiRun`): the layout, the folder, how to
start mpirun or a daemon under its guard, and how to stop or reap the ranks it started. The
launcher (:mod:`~sparktrain.task.mpi.mpirun`), the host daemons
(:mod:`~sparktrain.task.mpi.hosts`) and the loop that plays a task's roles
(:mod:`~sparktrain.task.mpi.mpi_launcher`) all take one."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparktrain import contract
from sparktrain.backends.base import Backend, rank_env
from sparktrain.layout.cluster import ClusterSpec, RankSpec
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.mpi import command
from sparktrain.task.mpi.peers import PeerServer
from sparktrain.task.process import RankProcess

if TYPE_CHECKING:
    import psutil

# mpirun and the daemons stop their ranks themselves (SIGTERM, grace, SIGKILL): they get that
# long and this much more before the supervisor kills them.
LAUNCHER_SLACK = 3.0
REAP_WAIT = 5.0


class MpiRun:
    """What every role of one task shares: the layout, the folder, and how to start a launcher.

    Args:
        session: the task's session.
        spec: the job's layout.
        backend: the run's backend (its ``env`` for MPI ranks).
        server: this task's peer server.
        local: True for the local supervisor, which launches and serves every host itself.
    """

    def __init__(
        self,
        session: TaskSession,
        spec: ClusterSpec,
        backend: Backend,
        server: PeerServer,
        local: bool,
    ) -> None:
        self.session = session
        self.config = session.config
        self.spec = spec
        self.backend = backend
        self.server = server
        self.local = local
        self.workdir = Path(".")
        self.stopping = False

    @property
    def grace(self) -> float:
        """How long mpirun or a daemon gets to stop its ranks before it is killed."""
        return self.config.grace_period + LAUNCHER_SLACK

    def host_env(self, host: str) -> dict[str, str]:
        """The environment of mpirun or a daemon on ``host``, inherited by its ranks."""
        env = dict(os.environ)
        env.update(self.config.env)
        env.update(self.session.common_env(self.workdir))
        table = {}
        for rank in self.spec.on_host(host):
            row = rank_env(self.spec, rank, self.config)
            row.update(self.backend.env(self.spec, rank, {}, self.config))
            row[contract.USE_GPU_ENV] = "0" if row.get("CUDA_VISIBLE_DEVICES") == "" else "1"
            table[rank.rank] = row
        env[contract.MPI_RANK_TABLE_ENV] = contract.rank_table(table)
        env[contract.OUTCOME_DIR_ENV] = str(self.workdir)
        return env

    def guarded(
        self, key: int, argv: list[str], env: dict[str, str], on_line: Callable[[int, str], None]
    ) -> RankProcess:
        """Start mpirun or a daemon under the guard that ties it to this task."""
        return RankProcess(
            key,
            [sys.executable, "-m", command.GUARD_MODULE, *argv],
            env,
            self.session.cwd,
            on_line=on_line,
            on_exit=self.session.on_exit,
        )

    def _rank_procs(self, ranks: Sequence[RankSpec]) -> list[psutil.Process]:
        """The live processes of ``ranks`` that wrote their pid file in this task's folder."""
        import psutil

        procs = []
        for rank in ranks:
            path = self.workdir / contract.pid_file_name(rank.rank)
            try:
                proc = psutil.Process(int(path.read_text(encoding="utf-8")))
                if proc.create_time() <= path.stat().st_mtime + 1:
                    procs.append(proc)
            except (OSError, ValueError, psutil.Error):
                continue
        return procs

    def terminate(self, grace: float) -> None:
        """SIGTERM the ranks started under this task, and SIGKILL those alive ``grace`` later.

        Used when the run is stopped (the driver's abort): the ranks get the grace period
        here, where Open MPI would give them only a second (see ``command.KILL_STEP``).
        """
        import psutil

        procs = self._rank_procs(self.spec.ranks)
        for proc in procs:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass

    def reap(self, host: str) -> None:
        """Make sure no rank of ``host`` started here outlives its launcher."""
        import psutil

        procs = self._rank_procs(self.spec.on_host(host))
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=REAP_WAIT)
