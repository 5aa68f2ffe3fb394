"""A task's supervisor: its link to the driver, and its ranks spawned and waited for.

:class:`_Supervisor` serves both launch paths: the torch path runs one worker process per rank
here; the MPI path (:mod:`sparktrain.task.mpirun`) borrows its events queue, its link to the
driver and the environment every worker gets. The per-process mechanics (own session,
output pump, SIGTERM → SIGKILL) are :mod:`sparktrain.task.supervise`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparktrain import wire
from sparktrain.backends.base import Backend, rank_env
from sparktrain.cluster import ClusterSpec, RankSpec
from sparktrain.config import RunConfig
from sparktrain.task.records import RESULT_FILE, error_file, rank_record
from sparktrain.task.supervise import RankProcess, stop_all
from sparktrain.worker import bootstrap, context

PAYLOAD_FILE = "payload.pkl"


@dataclasses.dataclass(frozen=True)
class TaskJob:
    """Everything a task needs, shipped inside the Spark closure (or handed over locally).

    Attributes:
        run_id: identifies the run (and names its processes' environment).
        attempt: 0 for the first launch, then one more per restart.
        config: the run's settings, as RunConfig.to_json().
        channel: ``host:port`` of the driver's channel.
        key: the run's HMAC key.
        payload: the pickled function and arguments.
        hook: private test hook, a pickled callable run with the task index before rendezvous.
    """

    run_id: str
    attempt: int
    config: dict[str, Any]
    channel: str
    key: bytes
    payload: bytes
    hook: bytes | None = None

    @property
    def run_config(self) -> RunConfig:
        """The RunConfig rebuilt on this side."""
        return RunConfig.from_json(self.config)


class _Supervisor:
    """Starts this task's ranks and waits for them, obeying aborts from the driver."""

    def __init__(self, job: TaskJob, client: wire.ChannelClient | None) -> None:
        self.job = job
        self.config = job.run_config
        self.client = client
        self.events: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self.forward_logs = self.config.driver_log_verbosity == "all"

    # -- the driver -----------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        """Best-effort message to the driver."""
        if self.client is None:
            return
        try:
            self.client.send(message)
        except (OSError, wire.FrameError):
            pass

    def started(self, rank: RankSpec, pid: int) -> None:
        """Tell the driver which process runs ``rank`` (mpirun, for all ranks of an MPI run)."""
        self.send(
            {
                "type": "started",
                "rank": rank.rank,
                "pid": pid,
                "host": rank.task.host,
                "index": rank.task.index,
            }
        )

    def listen(self) -> None:
        """Turn the driver's abort (or its disappearance) into an abort event."""
        if self.client is None:
            return
        client = self.client

        def read() -> None:
            reason = "the driver closed the connection"
            try:
                while True:
                    message = client.receive()
                    if message.get("type") == "abort":
                        reason = str(message.get("reason", "aborted by the driver"))
                        break
            except (OSError, EOFError, wire.FrameError):
                if client.closed:
                    return
            self.events.put(("abort", -1, reason))

        threading.Thread(target=read, name="sparktrain-abort-listener", daemon=True).start()

    # -- what every worker process gets -----------------------------------------------------

    @contextlib.contextmanager
    def workdir(self) -> Iterator[Path]:
        """A fresh folder holding the payload, where the ranks leave their outcome files."""
        path = Path(tempfile.mkdtemp(prefix=f"sparktrain-{self.job.run_id}-"))
        try:
            (path / PAYLOAD_FILE).write_bytes(self.job.payload)
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def common_env(self, workdir: Path) -> dict[str, str]:
        """What every worker process of this task gets, whatever its rank."""
        paths = [p for p in sys.path if p and os.path.exists(p)]
        return {
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(paths),
            context.RUN_ID_ENV: self.job.run_id,
            context.ATTEMPT_ENV: str(self.job.attempt),
            bootstrap.GRACE_ENV: str(self.config.grace_period),
            context.CHANNEL_ENV: self.job.channel,
            context.KEY_ENV: self.job.key.hex(),
            bootstrap.PAYLOAD_ENV: str(workdir / PAYLOAD_FILE),
            bootstrap.MAX_RESULT_ENV: str(self.config.max_result_bytes),
        }

    def on_exit(self, key: int, code: int) -> None:
        """A process's exit, as an event for the loop that waits on them."""
        self.events.put(("exit", key, code))

    # -- the torch path: one process per rank -----------------------------------------------

    def run(
        self,
        spec: ClusterSpec,
        mine: Sequence[RankSpec],
        backend: Backend,
        shared: Mapping[str, str],
    ) -> list[dict[str, Any]]:
        """Spawn ``mine``, supervise until all ended; returns one record per rank."""
        with self.workdir() as workdir:
            procs = {rank.rank: self._spawn(spec, rank, backend, shared, workdir) for rank in mine}
            return self._supervise(mine, procs, workdir)

    def _on_line(self, rank: int, line: str) -> None:
        if self.forward_logs:
            self.send({"type": "log", "rank": rank, "line": line})

    def _spawn(
        self,
        spec: ClusterSpec,
        rank: RankSpec,
        backend: Backend,
        shared: Mapping[str, str],
        workdir: Path,
    ) -> RankProcess:
        config = self.config
        env = dict(os.environ)
        env.update(rank_env(spec, rank, config))
        env.update(backend.env(spec, rank, shared, config))
        # The user's variables win over tunable defaults (OMP_NUM_THREADS, *_SOCKET_IFNAME);
        # the per-rank ones they may not set are refused by RunConfig.
        env.update(config.env)
        env.update(self.common_env(workdir))
        env.update(
            {
                context.USE_GPU_ENV: "0" if env.get("CUDA_VISIBLE_DEVICES") == "" else "1",
                bootstrap.ERROR_ENV: str(error_file(workdir, rank.rank)),
            }
        )
        if rank.rank == 0:
            env[bootstrap.RESULT_ENV] = str(workdir / RESULT_FILE)
        proc = RankProcess(
            rank.rank,
            [sys.executable, "-m", "sparktrain.worker"],
            env,
            str(workdir),
            on_line=self._on_line,
            on_exit=self.on_exit,
        )
        self.started(rank, proc.pid)
        return proc

    def _supervise(
        self, mine: Sequence[RankSpec], procs: dict[int, RankProcess], workdir: Path
    ) -> list[dict[str, Any]]:
        by_rank = {r.rank: r for r in mine}
        records: dict[int, dict[str, Any]] = {}
        stopping = False
        while len(records) < len(procs):
            kind, rank_id, value = self.events.get()
            if kind == "abort":
                if not stopping:
                    stopping = True
                    live = [p for r, p in procs.items() if r not in records]
                    threading.Thread(
                        target=stop_all, args=(live, self.config.grace_period), daemon=True
                    ).start()
                continue
            proc = procs[rank_id]
            proc.join()
            record = rank_record(
                by_rank[rank_id],
                workdir,
                int(value),
                proc.tail,
                proc.exit_time or time.time(),
                stopped=proc.stopped_by_supervisor,
            )
            records[rank_id] = record
            if record["status"] == "failed":
                self.send({"type": "failure", "failure": record["failure"]})
                if not stopping and len(procs) > 1:
                    # Local mode: the other ranks would block in their next collective.
                    self.events.put(("abort", -1, f"rank {rank_id} failed"))
        return [records[r.rank] for r in mine]
