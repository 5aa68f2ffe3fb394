"""A task's life: rendezvous, spawn its rank(s), supervise them, hand back the outcome.

The same code serves a Spark barrier task (one rank per task) and the local supervisor on
the driver (all ranks of an ``np < 0`` run); only how the TaskInfos are gathered differs.
What runs the ranks once the ClusterSpec is known is :class:`_Supervisor`
(:mod:`sparktrain.task.supervisor`), or :class:`MpiTask` for ``launcher="mpi"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from sparktrain import wire
from sparktrain.backends import get_backend
from sparktrain.cluster import TaskInfo, build_cluster_spec
from sparktrain.errors import ConfigurationError
from sparktrain.task.mpirun import MpiTask, uses_mpirun
from sparktrain.task.rsh import PeerServer
from sparktrain.task.supervisor import TaskJob, _Supervisor


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


def _run_hook(job: TaskJob, index: int) -> dict[str, Any]:
    """Run the private test hook; a mapping it returns overrides this task's ``host``."""
    if job.hook is None:
        return {}
    overrides = cloudpickle.loads(job.hook)(index)
    return dict(overrides) if isinstance(overrides, Mapping) else {}


@contextlib.contextmanager
def _session(
    job: TaskJob, bind: str, indices: range
) -> Iterator[tuple[_Supervisor, PeerServer | None]]:
    """The supervisor of tasks ``indices`` and, for an MPI run, its peer server.

    The peer server listens on the port the launcher offers at rendezvous. On the way out the
    driver is told that these tasks have exited.
    """
    try:
        client = wire.ChannelClient(job.channel, job.key, timeout=job.run_config.start_timeout)
    except OSError as exc:
        print(f"sparktrain: cannot reach the driver at {job.channel}: {exc}", file=sys.stderr)
        client = None
    supervisor = _Supervisor(job, client)
    server = None
    if uses_mpirun(supervisor.config.launcher):
        server = PeerServer(
            job.key,
            lambda kind, ident, message: supervisor.events.put((kind, ident, message)),
            bind=bind,
        )
    try:
        yield supervisor, server
    finally:
        if server is not None:
            server.close()
        for index in indices:
            supervisor.send({"type": "exited", "index": index})
        if client is not None:
            client.close()


def _hello(supervisor: _Supervisor, info: TaskInfo) -> None:
    supervisor.send({"type": "hello", "index": info.index, "info": json.loads(info.to_json())})


def run_spark_task(job: TaskJob, iterator: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """Body of one Spark barrier task: runs one rank and yields its record."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    config = job.run_config
    backend = get_backend(config.backend)
    with _session(job, "", range(index, index + 1)) as (supervisor, server):
        overrides = _run_hook(job, index)
        host = overrides.get("host") or ctx.getTaskInfos()[index].address.rpartition(":")[0]
        resources = ctx.resources()
        gpus = tuple(resources["gpu"].addresses) if "gpu" in resources else ()
        port = server.port if server is not None else free_port()
        info = TaskInfo(
            index=index,
            host=host,
            port=port,
            gpus=gpus,
            cpus=int(ctx.cpus()),
            pid=os.getpid(),
            ifname=interface_of(host),
        )
        _hello(supervisor, info)
        supervisor.listen()
        spec = build_cluster_spec([TaskInfo.from_json(t) for t in ctx.allGather(info.to_json())])
        if server is not None:
            yield from MpiTask(supervisor, spec, backend, server, index).run()
            return
        mine = spec.for_task(index)
        shared: dict[str, str] = {}
        if backend.needs_prepare:
            if mine.rank == 0:
                shared = backend.prepare(spec, config)
            shared = json.loads(ctx.allGather(json.dumps(shared))[spec.ranks[0].task.index])
        try:
            records = supervisor.run(spec, [mine], backend, shared)
        finally:
            if mine.rank == 0:
                backend.teardown()
        yield from records


def local_gpus(use_gpu: bool | None, n: int) -> list[str]:
    """GPU ids for ``n`` local ranks: one each, or none (CPU).

    Raises:
        ConfigurationError: ``use_gpu=True`` with fewer GPUs than ranks.
    """
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
        print(
            f"sparktrain: {n} local ranks but {len(devices)} GPU(s): running on CPU "
            "(pass use_gpu=False to silence this, or lower np)",
            file=sys.stderr,
        )
    return []


def run_local(job: TaskJob) -> list[dict[str, Any]]:
    """The local supervisor: all ``|np|`` ranks as subprocesses of the driver."""
    config = job.run_config
    n = config.world_size
    backend = get_backend(config.backend)
    gpus = local_gpus(config.use_gpu, n)
    cpus = max(1, (os.cpu_count() or 1) // n)
    with _session(job, "127.0.0.1", range(n)) as (supervisor, server):
        infos = []
        for index in range(n):
            host = _run_hook(job, index).get("host") or "127.0.0.1"
            port = 0
            if index == 0:
                port = server.port if server is not None else free_port()
            info = TaskInfo(
                index=index,
                host=host,
                port=port,
                gpus=(gpus[index],) if gpus else (),
                cpus=cpus,
                pid=os.getpid(),
                ifname=interface_of(host),
            )
            _hello(supervisor, info)
            infos.append(info)
        supervisor.listen()
        spec = build_cluster_spec(infos)
        if server is not None:
            return MpiTask(supervisor, spec, backend, server, None).run()
        shared = backend.prepare(spec, config) if backend.needs_prepare else {}
        try:
            return supervisor.run(spec, spec.ranks, backend, shared)
        finally:
            backend.teardown()
