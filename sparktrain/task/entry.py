"""A task's life: rendezvous, spawn its rank(s), supervise them, hand back the outcome.

The same code serves a Spark barrier task (one rank per task) and the local supervisor on
the driver (all ranks of an ``np < 0`` run); only how the TaskInfos are gathered differs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from sparktrain import wire
from sparktrain.backends import get_backend
from sparktrain.backends.base import Backend, rank_env
from sparktrain.cluster import ClusterSpec, RankSpec, TaskInfo, build_cluster_spec
from sparktrain.config import RunConfig
from sparktrain.errors import WorkerFailure
from sparktrain.task.mpirun import MpiTask, uses_mpirun
from sparktrain.task.rsh import PeerServer
from sparktrain.task.supervise import RankProcess, stop_all
from sparktrain.worker import bootstrap, context

RUN_ID_ENV = "_SPARKTRAIN_RUN_ID"


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


def free_port() -> int:
    """A TCP port that was free a moment ago on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds ``address``, if any does."""
    import psutil

    try:
        ip = socket.gethostbyname(address)
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return None


def _record(rank: RankSpec, status: str, result: bytes | None, failure: WorkerFailure | None
            ) -> dict[str, Any]:
    return {
        "index": rank.task.index,
        "rank": rank.rank,
        "status": status,
        "result": result,
        "failure": failure.to_json() if failure else None,
    }


class _Supervisor:
    """Starts this task's ranks and waits for them, obeying aborts from the driver."""

    def __init__(self, job: TaskJob, client: wire.ChannelClient | None) -> None:
        self.job = job
        self.config = job.run_config
        self.client = client
        self.events: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self.forward_logs = self.config.driver_log_verbosity == "all"

    def send(self, message: dict[str, Any]) -> None:
        """Best-effort message to the driver."""
        if self.client is None:
            return
        try:
            self.client.send(message)
        except (OSError, wire.FrameError):
            pass

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

    def _on_line(self, rank: int, line: str) -> None:
        if self.forward_logs:
            self.send({"type": "log", "rank": rank, "line": line})

    def run(
        self, spec: ClusterSpec, mine: Sequence[RankSpec], backend: Backend,
        shared: Mapping[str, str],
    ) -> list[dict[str, Any]]:
        """Spawn ``mine``, supervise until all ended; returns one record per rank."""
        workdir = Path(tempfile.mkdtemp(prefix=f"sparktrain-{self.job.run_id}-"))
        try:
            payload_path = workdir / "payload.pkl"
            payload_path.write_bytes(self.job.payload)
            procs: dict[int, RankProcess] = {}
            for rank in mine:
                procs[rank.rank] = self._spawn(spec, rank, backend, shared, workdir, payload_path)
            return self._supervise(spec, mine, procs, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def common_env(self, payload_path: Path) -> dict[str, str]:
        """What every worker process of this task gets, whatever its rank."""
        paths = [p for p in sys.path if p and os.path.exists(p)]
        return {
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(paths),
            RUN_ID_ENV: self.job.run_id,
            context.ATTEMPT_ENV: str(self.job.attempt),
            bootstrap.GRACE_ENV: str(self.config.grace_period),
            context.CHANNEL_ENV: self.job.channel,
            context.KEY_ENV: self.job.key.hex(),
            bootstrap.PAYLOAD_ENV: str(payload_path),
            bootstrap.MAX_RESULT_ENV: str(self.config.max_result_bytes),
        }

    def _spawn(
        self, spec: ClusterSpec, rank: RankSpec, backend: Backend, shared: Mapping[str, str],
        workdir: Path, payload_path: Path,
    ) -> RankProcess:
        config = self.config
        env = dict(os.environ)
        env.update(rank_env(spec, rank, config))
        env.update(backend.env(spec, rank, shared, config))
        # The user's variables win over tunable defaults (OMP_NUM_THREADS, *_SOCKET_IFNAME);
        # the per-rank ones they may not set are refused by RunConfig.
        env.update(config.env)
        env.update(self.common_env(payload_path))
        env.update(
            {
                context.USE_GPU_ENV: "0" if env.get("CUDA_VISIBLE_DEVICES") == "" else "1",
                bootstrap.ERROR_ENV: str(workdir / f"error-{rank.rank}.json"),
            }
        )
        if rank.rank == 0:
            env[bootstrap.RESULT_ENV] = str(workdir / "result.pkl")
        proc = RankProcess(
            rank.rank,
            [sys.executable, "-m", "sparktrain.worker"],
            env,
            str(workdir),
            on_line=self._on_line,
            on_exit=lambda r, code: self.events.put(("exit", r, code)),
        )
        self.send({"type": "started", "rank": rank.rank, "pid": proc.pid,
                   "host": rank.task.host, "index": rank.task.index})
        return proc

    def _supervise(
        self, spec: ClusterSpec, mine: Sequence[RankSpec], procs: dict[int, RankProcess],
        workdir: Path,
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
                    threading.Thread(target=stop_all, args=(live, self.config.grace_period),
                                     daemon=True).start()
                continue
            proc = procs[rank_id]
            proc.join()
            rank = by_rank[rank_id]
            record = self._outcome(rank, proc, int(value), workdir)
            if proc.stopped_by_supervisor and record["status"] == "failed":
                record["status"] = "stopped"
            records[rank_id] = record
            if record["status"] == "failed":
                self.send({"type": "failure", "failure": record["failure"]})
                if not stopping and len(procs) > 1:
                    # Local mode: the other ranks would block in their next collective.
                    self.events.put(("abort", -1, f"rank {rank_id} failed"))
        return [records[r.rank] for r in mine]

    def _outcome(self, rank: RankSpec, proc: RankProcess, code: int, workdir: Path
                 ) -> dict[str, Any]:
        error_path = workdir / f"error-{rank.rank}.json"
        result_path = workdir / "result.pkl"
        base = WorkerFailure(rank=rank.rank, host=rank.task.host, exit_code=code,
                             output_tail=tuple(proc.tail), time=proc.exit_time or time.time(),
                             phase="lost")
        if error_path.exists():
            data = json.loads(error_path.read_text(encoding="utf-8"))
            failure = dataclasses.replace(
                base, exc_type=data.get("exc_type"), message=data.get("message", ""),
                traceback=data.get("traceback"), phase=data.get("phase", "run"),
                user_error=bool(data.get("user_error")), time=float(data.get("time", base.time)),
            )
            return _record(rank, "failed", None, failure)
        if code != 0:
            return _record(rank, "failed", None, base)
        if rank.rank == 0:
            if not result_path.exists():
                failure = dataclasses.replace(
                    base, message="the process exited with code 0 but wrote no result "
                    "(did the function call os._exit?)")
                return _record(rank, "failed", None, failure)
            return _record(rank, "ok", result_path.read_bytes(), None)
        return _record(rank, "ok", None, None)


def _run_hook(job: TaskJob, index: int) -> dict[str, Any]:
    """Run the private test hook; a mapping it returns overrides this task's ``host``."""
    if job.hook is None:
        return {}
    overrides = cloudpickle.loads(job.hook)(index)
    return dict(overrides) if isinstance(overrides, Mapping) else {}


def _peer_server(job: TaskJob, supervisor: _Supervisor, bind: str) -> PeerServer | None:
    """The listener of an MPI run's task (its port is the one offered at rendezvous)."""
    if not uses_mpirun(job.run_config.launcher):
        return None
    return PeerServer(job.key, lambda kind, ident, message: supervisor.events.put(
        (kind, ident, message)), bind=bind)


def _connect(job: TaskJob) -> wire.ChannelClient | None:
    try:
        return wire.ChannelClient(job.channel, job.key, timeout=job.run_config.start_timeout)
    except OSError as exc:
        print(f"sparktrain: cannot reach the driver at {job.channel}: {exc}", file=sys.stderr)
        return None


def _prepare(backend: Backend, spec: ClusterSpec, config: RunConfig) -> dict[str, str]:
    return backend.prepare(spec, config) if backend.needs_prepare else {}


def run_spark_task(job: TaskJob, iterator: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """Body of one Spark barrier task: runs one rank and yields its record."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    config = job.run_config
    backend = get_backend(config.backend)
    client = _connect(job)
    supervisor = _Supervisor(job, client)
    server = _peer_server(job, supervisor, "")
    try:
        overrides = _run_hook(job, index)
        host = overrides.get("host") or ctx.getTaskInfos()[index].address.rpartition(":")[0]
        resources = ctx.resources()
        gpus = tuple(resources["gpu"].addresses) if "gpu" in resources else ()
        port = server.port if server is not None else free_port()
        info = TaskInfo(index=index, host=host, port=port, gpus=gpus,
                        cpus=int(ctx.cpus()), pid=os.getpid(), ifname=interface_of(host))
        supervisor.send({"type": "hello", "index": index, "info": json.loads(info.to_json())})
        supervisor.listen()
        spec = build_cluster_spec([TaskInfo.from_json(t) for t in ctx.allGather(info.to_json())])
        if server is not None:
            yield from MpiTask(supervisor, spec, backend, server, index).run()
            return
        mine = spec.for_task(index)
        shared: dict[str, str] = {}
        if backend.needs_prepare:
            if mine.rank == 0:
                shared = _prepare(backend, spec, config)
            shared = json.loads(ctx.allGather(json.dumps(shared))[spec.ranks[0].task.index])
        try:
            records = supervisor.run(spec, [mine], backend, shared)
        finally:
            if mine.rank == 0:
                backend.teardown()
        yield from records
    finally:
        if server is not None:
            server.close()
        supervisor.send({"type": "exited", "index": index})
        if client is not None:
            client.close()


def local_gpus(use_gpu: bool | None, n: int) -> list[str]:
    """GPU ids for ``n`` local ranks: one each, or none (CPU).

    Raises:
        ConfigurationError: ``use_gpu=True`` with fewer GPUs than ranks.
    """
    from sparktrain.errors import ConfigurationError

    if use_gpu is False:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    elif "torch" in sys.modules:
        devices = [str(i) for i in range(sys.modules["torch"].cuda.device_count())]
    else:
        root = Path("/proc/driver/nvidia/gpus")
        devices = [str(i) for i in range(len(list(root.iterdir())))] if root.is_dir() else []
    if len(devices) >= n:
        return devices[:n]
    if use_gpu:
        raise ConfigurationError(
            f"np=-{n} with use_gpu=True needs {n} GPUs on the driver, found {len(devices)}; "
            "NCCL cannot put two ranks on one GPU: use np=-1 per GPU, or use_gpu=False"
        )
    if devices:
        print(f"sparktrain: {n} local ranks but {len(devices)} GPU(s): running on CPU "
              "(pass use_gpu=False to silence this, or lower np)", file=sys.stderr)
    return []


def run_local(job: TaskJob) -> list[dict[str, Any]]:
    """The local supervisor: all ``|np|`` ranks as subprocesses of the driver."""
    config = job.run_config
    n = config.world_size
    backend = get_backend(config.backend)
    gpus = local_gpus(config.use_gpu, n)
    cpus = max(1, (os.cpu_count() or 1) // n)
    client = _connect(job)
    supervisor = _Supervisor(job, client)
    server = _peer_server(job, supervisor, "127.0.0.1")
    try:
        infos = []
        for index in range(n):
            host = _run_hook(job, index).get("host") or "127.0.0.1"
            port = 0
            if index == 0:
                port = server.port if server is not None else free_port()
            info = TaskInfo(index=index, host=host, port=port,
                            gpus=(gpus[index],) if gpus else (), cpus=cpus, pid=os.getpid(),
                            ifname=interface_of(host))
            supervisor.send({"type": "hello", "index": index, "info": json.loads(info.to_json())})
            infos.append(info)
        supervisor.listen()
        spec = build_cluster_spec(infos)
        if server is not None:
            return MpiTask(supervisor, spec, backend, server, None).run()
        shared = _prepare(backend, spec, config)
        try:
            return supervisor.run(spec, spec.ranks, backend, shared)
        finally:
            backend.teardown()
    finally:
        if server is not None:
            server.close()
        for index in range(n):
            supervisor.send({"type": "exited", "index": index})
        if client is not None:
            client.close()


HookFn = Callable[[int], None]
