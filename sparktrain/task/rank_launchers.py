"""Who creates a task's rank processes: the seam between the rendezvous and the ranks.

Every task runs the same steps (:mod:`sparktrain.task.entry`): offer a port at rendezvous,
learn the ClusterSpec, then hand it to its :class:`RankLauncher`, which starts the ranks,
supervises them and returns one record per rank it is responsible for. Launchers are looked
up by the run's ``launcher`` setting, never branched on:

* :class:`ProcessLauncher` (default): one ``python -m sparktrain.worker`` per rank of this
  task, started and watched here.
* ``"mpi"``: :class:`sparktrain.task.mpi.mpi_launcher.MpiLauncher`, mpirun on rank 0's task.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from sparktrain import contract
from sparktrain.backends.base import Backend, rank_env
from sparktrain.config import RunConfig
from sparktrain.errors import WorkerFailure
from sparktrain.layout.cluster import ClusterSpec, RankSpec
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.task.collectives import CollectiveSlots, interval_for
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.process import STACK_WAIT, RankProcess, dump_all, stop_all
from sparktrain.task.rank_outcomes import (
    clip,
    error_file,
    launch_times,
    rank_record,
    record,
    with_stack,
)
from sparktrain.task.zygote_share import Key
from sparktrain.task.zygotes import LOAD_WAIT, import_key, zygote_for
from sparktrain.wire import protocol

# Hands what rank 0's task prepared (e.g. a rendezvous server's address) to every task: called
# with the values on rank 0's task and None on the others; returns rank 0's values, or None
# when the run was stopped first.
Exchange = Callable[[dict[str, str] | None], dict[str, str] | None]

# launcher setting -> "module:Class"; modules are imported only when used.
_REGISTRY: dict[str, str] = {"mpi": "sparktrain.task.mpi.mpi_launcher:MpiLauncher"}


def reserve_port() -> socket.socket:
    """A socket holding a free TCP port of this host, on every address, for a listener still
    to come.

    The port is offered at rendezvous and rank 0's store listens on it seconds later, in
    another process. A port that was merely free a moment ago can be taken in between (an
    outgoing connection's ephemeral port, another program's ``bind``); this socket keeps it
    bound, so the kernel gives it to nobody else, while ``SO_REUSEADDR`` and not listening
    let the store (torch's, or :mod:`sparktrain.worker.bound_store`'s, both reusing
    addresses) bind and listen on it. Close it once the ranks have ended.

    It is bound to the wildcard address, IPv6 and IPv4 together where the host has IPv6, as
    torch's store is: a port chosen for one address alone may be held on another (a loopback
    listener), where a store on every interface then cannot listen.
    """
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, 0))
        except OSError:
            sock.close()
            if family == socket.AF_INET:
                raise
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise OSError("no TCP socket can be made on this host")


class RankLauncher(abc.ABC):
    """Creates and supervises the rank processes of one task (or of the local supervisor).

    Args:
        session: the task's session (driver link, events, worker environment).
        bind: the address to listen on, for launchers that serve their peers.
    """

    def __init__(self, session: TaskSession, bind: str) -> None:
        self.session = session
        self.config = session.config
        self.bind = bind

    @abc.abstractmethod
    def port(self) -> int:
        """The port this task offers at rendezvous."""

    @abc.abstractmethod
    def run(
        self, spec: ClusterSpec, tasks: Sequence[int], backend: Backend, exchange: Exchange
    ) -> list[RankOutcome]:
        """Run the ranks of ``tasks`` (partition indices) until they have all ended.

        Returns:
            One record per rank this launcher answers for (see :mod:`sparktrain.task.rank_outcomes`).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the launcher holds (called once, after :meth:`run` or instead of it)."""


def launcher_for(config: RunConfig) -> type[RankLauncher]:
    """The launcher class of ``config.launcher`` (:class:`ProcessLauncher` by default)."""
    target = _REGISTRY.get(config.launcher or "")
    if target is None:
        return ProcessLauncher
    module_name, _, cls_name = target.partition(":")
    cls: type[RankLauncher] = getattr(importlib.import_module(module_name), cls_name)
    return cls


def worker_env(
    session: TaskSession,
    spec: ClusterSpec,
    rank: RankSpec,
    backend: Backend,
    shared: Mapping[str, str],
    workdir: Path,
) -> dict[str, str]:
    """The environment of ``rank``'s own worker process, over this process's environment."""
    config = session.config
    env = dict(os.environ)
    env.update(rank_env(spec, rank, config))
    env.update(backend.env(spec, rank, shared, config))
    # The user's variables win over tunable defaults (OMP_NUM_THREADS, *_SOCKET_IFNAME);
    # the per-rank ones they may not set are refused by RunConfig.
    env.update(config.env)
    env.update(backend.env_defaults(env))
    env.update(session.common_env(workdir))
    if env.get("CUDA_VISIBLE_DEVICES"):
        # Asked for its stack, a rank with GPUs writes its NCCL flight recorder trace too.
        env[contract.NCCL_TRACE_ENV] = "1"
        if session.files.folder is not None:
            env[contract.NCCL_TRACE_DIR_ENV] = str(session.files.folder)
    env.update(
        {
            contract.USE_GPU_ENV: "0" if env.get("CUDA_VISIBLE_DEVICES") == "" else "1",
            contract.ERROR_ENV: str(error_file(workdir, rank.rank)),
            contract.TIMES_ENV: str(workdir / contract.times_file_name(rank.rank)),
        }
    )
    env.update(session.stream.for_slot(rank.task.index))
    if rank.rank == 0 or session.job.all_ranks:
        env[contract.RESULT_ENV] = str(workdir / contract.result_file_name(rank.rank))
    return env


class ProcessLauncher(RankLauncher):
    """One worker process per rank, started in its own session and watched here."""

    def __init__(self, session: TaskSession, bind: str) -> None:
        super().__init__(session, bind)
        # Held while the ranks' stacks are being gathered for the driver.
        self._showing = threading.Lock()
        # The port offered for rank 0's store, held until the ranks have ended.
        self._reserved: socket.socket | None = None
        # The ranks' collective counters while they run (None when stall_timeout is off).
        self._slots: CollectiveSlots | None = None

    def port(self) -> int:
        if self._reserved is None:
            self._reserved = reserve_port()
        port = int(self._reserved.getsockname()[1])
        if not sys.platform.startswith("linux"):
            # Linux lets a listener share a port with a bound, idle socket when both reuse
            # addresses; elsewhere the rules differ, so the port is only free a moment ago.
            self.close()
        return port

    def close(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    def run(
        self, spec: ClusterSpec, tasks: Sequence[int], backend: Backend, exchange: Exchange
    ) -> list[RankOutcome]:
        mine = [r for r in spec.ranks if r.task.index in tasks]
        holds_rank0 = spec.first in mine
        try:
            shared: dict[str, str] | None = {}
            if backend.needs_prepare:
                shared = exchange(backend.prepare(spec, self.config) if holds_rank0 else None)
            if shared is None:
                return [record(r, RankStatus.STOPPED) for r in mine]
            with self.session.workdir() as workdir, self._counting(workdir, mine):
                cold: dict[Key, tuple[dict[str, str], str]] = {}
                procs = {r.rank: self._spawn(spec, r, backend, shared, workdir, cold) for r in mine}
                records = self._supervise(mine, procs, workdir)
            for env, cwd in cold.values():
                # Not beside the cold ranks, nor beside the job's end (see zygotes).
                self.session.warm_later(env, cwd)
            return records
        finally:
            if holds_rank0:
                backend.teardown()

    @contextlib.contextmanager
    def _counting(self, workdir: Path, mine: Sequence[RankSpec]) -> Iterator[None]:
        """Count the ranks' collectives for the driver's hang watch while they run."""
        interval = interval_for(self.config)
        if interval is None:
            yield
            return
        with CollectiveSlots(workdir, [r.rank for r in mine], self.session.send, interval) as slots:
            self._slots = slots
            try:
                yield
            finally:
                self._slots = None

    def _spawn(
        self,
        spec: ClusterSpec,
        rank: RankSpec,
        backend: Backend,
        shared: Mapping[str, str],
        workdir: Path,
        cold: dict[Key, tuple[dict[str, str], str]],
    ) -> RankProcess:
        """Start one rank: forked from its environment's zygote, waiting for one that is
        loading, else cold (its environment is then added to ``cold``, whose zygotes the
        caller starts once the ranks have ended)."""
        asked = time.time()
        env = worker_env(self.session, spec, rank, backend, shared, workdir)
        if self._slots is not None:
            env.update(self._slots.env(rank.rank))
        cwd = self.session.cwd
        zygote = None
        if self.config.warm_start:
            zygote = zygote_for(
                env, cwd, wait=LOAD_WAIT, shared=self.session.in_executor, start=False
            )
            if zygote is None:
                cold.setdefault(import_key(env, cwd), (env, cwd))
        proc = RankProcess(
            rank.rank,
            [sys.executable, "-m", "sparktrain.worker"],
            env,
            cwd,
            on_line=self.session.log,
            on_exit=self.session.on_exit,
            dumps_stacks=True,
            zygote=zygote,
        )
        proc.spawn_time = asked  # a zygote that had to load first counts in the start
        self.session.started(rank, proc.pid)
        return proc

    def _supervise(
        self, mine: Sequence[RankSpec], procs: dict[int, RankProcess], workdir: Path
    ) -> list[RankOutcome]:
        by_rank = {r.rank: r for r in mine}
        records: dict[int, RankOutcome] = {}
        stopping = False
        events = self.session.events
        while len(records) < len(procs):
            kind, rank_id, value = events.get()
            live = [p for r, p in procs.items() if r not in records]
            if kind == "abort":
                if not stopping:
                    stopping = True
                    threading.Thread(
                        target=stop_all,
                        args=(live, self.config.grace_period, STACK_WAIT),
                        daemon=True,
                    ).start()
                continue
            if kind == "stacks":
                if not stopping and self._showing.acquire(blocking=False):
                    threading.Thread(
                        target=self._show_stacks, args=(live, by_rank), daemon=True
                    ).start()
                continue
            if kind != "exit" or rank_id not in procs:
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
                stack=proc.last_stack,
                returns=self.session.job.all_ranks,
            )
            record.times = launch_times(
                workdir, rank_id, self.session.go_time, proc.spawn_time, proc.forked
            )
            records[rank_id] = record
            failure = record.failure.to_json() if record.failure is not None else None
            if record.status is RankStatus.STOPPED and failure:
                # Also over the channel: a cancelled Spark job may never return its records.
                self.session.send(protocol.STACK(record=failure, stopped=True))
            if record.status is RankStatus.FAILED:
                self.session.send(protocol.FAILURE(failure=failure))
                if not stopping and len(procs) > 1:
                    # Ranks of this task (local mode, or k GPUs per task) would block in
                    # their next collective.
                    events.put(("abort", -1, f"rank {rank_id} failed"))
        return [records[r.rank] for r in mine]

    def _show_stacks(self, procs: list[RankProcess], by_rank: Mapping[int, RankSpec]) -> None:
        """Send the driver where each running rank is; they run on."""
        try:
            found = dump_all(procs, STACK_WAIT)
        finally:
            self._showing.release()  # one request at a time: a second one meanwhile is moot
        for proc in procs:
            if proc.proc.poll() is not None:
                continue  # it ended meanwhile: its record tells how
            rank = by_rank[proc.rank]
            base = WorkerFailure(
                rank=rank.rank,
                host=rank.task.host,
                output_tail=tuple(clip(proc.tail, 20)),
                time=time.time(),
                phase="running",
            )
            state = with_stack(base, found.get(proc.rank))
            self.session.send(protocol.STACK(record=state.to_json(), stopped=False))


def local_exchange(values: dict[str, str] | None) -> dict[str, str] | None:
    """The :data:`Exchange` of the local supervisor, which holds every rank itself."""
    return values
