"""A task's life: rendezvous, hand the layout to its launcher, return the ranks' records.

The same steps serve a Spark barrier task (one rank per task, or one per GPU when a task holds
several) and the local supervisor on the driver (all ranks of an ``np < 0`` run); only how
the TaskInfos are gathered differs. Who then creates the rank processes is the run's
:class:`~sparktrain.task.rank_launchers.RankLauncher` (our own supervisor, or mpirun).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from sparktrain import wire
from sparktrain.backends import get_backend
from sparktrain.backends.base import Backend
from sparktrain.errors import ConfigurationError
from sparktrain.layout.cluster import TaskInfo
from sparktrain.layout.rendezvous import view_of
from sparktrain.log import get_logger
from sparktrain.rank_outcome import RankOutcome
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.gpus import gpu_uuids
from sparktrain.task.interface_probe import ProbeListener, settle_interface
from sparktrain.task.netinfo import interface_addresses, name_address
from sparktrain.task.rank_launchers import Exchange, RankLauncher, launcher_for, local_exchange
from sparktrain.task.result_upload import deliver
from sparktrain.task.stream_feed import feeding
from sparktrain.wire import protocol
from sparktrain.wire.address import listen_address

_log = get_logger(__name__)

__all__ = ["TaskJob", "local_gpus", "run_local", "run_spark_task"]


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
    job: TaskJob, bind: str, indices: range, session: TaskSession | None = None
) -> Iterator[tuple[TaskSession, RankLauncher]]:
    """The session (``session``, or one over a new connection to the driver) and the launcher
    of tasks ``indices``.

    On the way out the launcher is closed, the driver is told that these tasks have exited,
    and the session is finished (:meth:`~sparktrain.task.driver_link.TaskSession.finish`).
    """
    if session is None:
        client = None
        try:
            client = wire.ChannelClient(job.channel, job.key, timeout=job.run_config.start_timeout)
        except OSError as exc:
            _log.warning("cannot reach the driver at %s: %s", job.channel, exc)
        session = TaskSession(job, client)
    launcher = launcher_for(session.config)(session, bind)
    try:
        yield session, launcher
    finally:
        launcher.close()
        session.close_logs()  # the ranks' last lines come before the word that they exited
        for index in indices:
            session.send(protocol.EXITED(index=index))
        session.finish()


def _hello(session: TaskSession, info: TaskInfo) -> None:
    session.send(protocol.HELLO(index=info.index, info=json.loads(info.to_json())))


def _launch(
    session: TaskSession,
    launcher: RankLauncher,
    tasks: Sequence[int],
    backend: Backend,
    exchange: Exchange,
    probes: ProbeListener | None = None,
) -> list[RankOutcome]:
    """Wait for the driver's word that every task is there, settle the network interface
    (probing the other hosts, where ``probes`` answers theirs), then start the ranks of
    ``tasks``.

    Returns:
        Their records; none when the run was stopped before they could start.
    """
    go = session.wait_for_go()
    if go is None:
        return []
    view = view_of(go)
    try:
        settled = settle_interface(session, view, view.spec.for_task(tasks[0]).task)
    finally:
        if probes is not None:
            probes.close()
    if settled is None:
        return []
    return launcher.run(settled, tasks, backend, exchange)


def run_spark_task(
    job: TaskJob, iterator: Iterator[Any], session: TaskSession | None = None
) -> Iterator[dict[str, Any]]:
    """Body of one Spark barrier task: runs its rank(s) and yields their records, each as
    it crosses to the driver (:meth:`RankOutcome.to_json`).

    A task that runs k ranks (``job.ranks_per_task``, one per GPU it holds) says hello for
    k slots, each with one of its GPUs and its share of its cores, and its launcher runs
    them all, as the local supervisor runs its slots.

    Args:
        job: what the task was handed.
        iterator: the partition: unused, except in a run given a DataFrame, where it is
            the DataFrame's partition as Arrow batches, which the task streams to its ranks.
        session: how the task speaks with the driver; by default over its channel.
    """
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    backend = get_backend(job.run_config.backend)
    overrides = _run_hook(job, index)
    host = overrides.get("host") or ctx.getTaskInfos()[index].address.rpartition(":")[0]
    # The other tasks reach this one at ``host``: a launcher that serves them listens there
    # alone when it is this machine's address, else on every interface (the host Spark knows
    # an executor by may be an address this machine does not hold, as behind NAT).
    bind = listen_address(host, "")
    k = job.ranks_per_task
    slots = range(index * k, index * k + k)
    interfaces = interface_addresses()
    # Probes come to this host's interfaces' addresses alone: listen there, not everywhere.
    addresses = [address for _, addrs in interfaces for address in addrs]
    with (
        _session(job, bind, slots, session) as (session, launcher),
        ProbeListener(job.key, slots[0], addresses) as probes,
    ):
        session.spark_files = spark_files_root()
        session.in_executor = True
        resources = ctx.resources()
        gpus = tuple(resources["gpu"].addresses) if "gpu" in resources else ()
        uuids = gpu_uuids(gpus)
        ifname = interface_of(host)
        resolved = name_address()
        for slot, (own, own_uuids) in enumerate(zip(share(gpus, k), share(uuids, k), strict=True)):
            info = TaskInfo(
                index=slots[slot],
                host=host,
                port=launcher.port() if slot == 0 else 0,
                gpus=own,
                cpus=max(1, int(ctx.cpus()) // k),
                pid=os.getpid(),
                ifname=ifname,
                gpu_uuids=own_uuids,
                interfaces=interfaces,
                probe_port=probes.port,
                name_address=resolved,
                slot=slot,
            )
            _hello(session, info)
        session.listen()
        stream = iterator if job.stream_window else None
        with feeding(job, stream, slots) as session.stream:
            records = _launch(session, launcher, list(slots), backend, session.exchange, probes)
        for outcome in deliver(session, records, host):
            yield outcome.to_json()


def share(items: Sequence[str], k: int) -> list[tuple[str, ...]]:
    """``items`` (a task's GPUs, or their UUIDs) dealt to its ``k`` slots in order, equally.

    A task given k GPUs gives one to each slot; none (CPU, or UUIDs not read) gives none.
    """
    if len(items) < k or len(items) % k:
        # Spark gives a task exactly k GPUs; anything else is dealt whole to no slot.
        return [() for _ in range(k)]
    each = len(items) // k
    return [tuple(items[i * each : (i + 1) * each]) for i in range(k)]


def spark_files_root() -> str | None:
    """The absolute SparkFiles root of this task (or of the driver's active SparkContext).

    Executors put files and archives there (``addFile``, ``--files``, ``--archives``); it is
    relative (``.``) on executors, so it is made absolute while this is the task's folder.
    """
    try:
        from pyspark import SparkContext, SparkFiles

        if not SparkFiles._is_running_on_worker and SparkContext._active_spark_context is None:
            return None  # on the driver without a SparkContext: there is nothing to find
        return os.path.abspath(SparkFiles.getRootDirectory())
    except Exception:  # noqa: BLE001 - Spark Connect, or an older PySpark: go without
        return None


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
        _log.warning(
            "%d local ranks but %d GPU(s): running on CPU "
            "(pass use_gpu=False to silence this, or lower np)",
            n,
            len(devices),
        )
    return []


# How long a local run's end waits for the driver's reader of a DataFrame to leave Spark.
_DRIVER_INPUT_WAIT = 5.0


def run_local(job: TaskJob, batches: Iterator[Any] | None = None) -> list[dict[str, Any]]:
    """The local supervisor: all ``|np|`` ranks as subprocesses of the driver; returns their
    records as a Spark job would (:meth:`RankOutcome.to_json`). ``batches``: a run given a
    DataFrame, read on the driver and streamed to the ranks."""
    config = job.run_config
    n = config.world_size
    backend = get_backend(config.backend)
    gpus = local_gpus(config.use_gpu, n)
    cpus = max(1, (os.cpu_count() or 1) // n)
    with _session(job, "127.0.0.1", range(n)) as (session, launcher):
        session.spark_files = spark_files_root() if "pyspark" in sys.modules else None
        for index in range(n):
            host = _run_hook(job, index).get("host") or "127.0.0.1"
            info = TaskInfo(
                index=index,
                host=host,
                port=launcher.port() if index == 0 else 0,
                gpus=(gpus[index],) if gpus else (),
                cpus=cpus,
                pid=os.getpid(),
                ifname=interface_of(host),
            )
            _hello(session, info)
        session.listen()
        with feeding(job, batches, range(n), input_wait=_DRIVER_INPUT_WAIT) as session.stream:
            records = _launch(session, launcher, range(n), backend, local_exchange)
        if job.all_ranks:
            # Every rank's value goes through the driver's receiver, as from executors: the
            # total is held to max_result_bytes, and what does not fit is kept on this host.
            records = list(deliver(session, records, socket.gethostname()))
        # In the same form as from executors, so that the driver reads one kind of record.
        return [outcome.to_json() for outcome in records]
