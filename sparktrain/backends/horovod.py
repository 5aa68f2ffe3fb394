"""Horovod backend: Horovod's own Gloo rendezvous server plus the ``HOROVOD_*`` rank env.

With ``launcher="mpi"`` the ranks are started by mpirun instead (see
:mod:`sparktrain.task.mpi`) and this backend only selects Horovod's MPI controller.

Where Horovod is not installed (or ``horovod_impl="builtin"``), the ranks get sparktrain's
own ``horovod.torch`` on torch.distributed (:mod:`sparktrain.hvdcompat`) instead: the same
``HOROVOD_*`` places, torch's ``MASTER_ADDR``/``MASTER_PORT``, and
:data:`~sparktrain.contract.HOROVOD_SHIM_ENV`, which makes the worker put the shim first on
the rank's path. Rank 0's task decides, once, in :meth:`HorovodBackend.prepare`, so that every
rank uses the same implementation.

``hvd.init()`` under Gloo reads its place in the job from the environment
(``HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*``) and meets its peers through an HTTP key-value store
(``HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT``), in three scopes: ``global``, ``local_<hostname>`` and
``cross_<local_rank>``. :meth:`HorovodBackend.prepare` starts that store (the one
``horovodrun --gloo`` starts) where rank 0 runs, sized by the same plan :func:`horovod_slots`
derives from the ClusterSpec, so Horovod's ranks are exactly sparktrain's ``RANK``. Horovod's
"hosts" are sparktrain's nodes (:func:`~sparktrain.layout.cluster.node_rule`): where every Spark task
is a node, each task is a host of its own to Horovod, so ``hvd.local_rank()`` is
``LOCAL_RANK``. mpirun counts ranks per host whatever it is told, so ``launcher="mpi"`` is
refused where nodes are tasks.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparktrain import contract
from sparktrain.backends.base import Backend, interface_env
from sparktrain.backends.horovod_install import (
    INSTALL_HINT,
    _links_mpi,
    builtin_reason,
    horovod_torch_library,
    installed_horovod,
)
from sparktrain.backends.torch import collective_defaults, is_loopback, loopback_env
from sparktrain.config import MPI_TASK_NODES, RunConfig, conf_key
from sparktrain.errors import ConfigurationError, SparkTrainError
from sparktrain.layout.cluster import ClusterSpec, RankSpec

LAUNCHERS = (None, "gloo", "mpi")
ADDR_KEY = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
PORT_KEY = "HOROVOD_GLOO_RENDEZVOUS_PORT"


@dataclasses.dataclass(frozen=True)
class HorovodSlot:
    """One rank's place in Horovod's terms (the fields of Horovod's ``SlotInfo``).

    Attributes:
        hostname: the node's name in rendezvous scopes (``local_<hostname>``).
        rank: global rank, the same as sparktrain's ``RANK``.
        size: number of ranks.
        local_rank: index among the ranks of the same node (``LOCAL_RANK``).
        local_size: number of ranks of that node.
        cross_rank: index of this node among the nodes that have a rank with this local rank.
        cross_size: number of nodes that have a rank with this local rank.
    """

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def env(self) -> dict[str, str]:
        """The ``HOROVOD_*`` variables ``hvd.init()`` reads under Gloo."""
        return {
            "HOROVOD_HOSTNAME": self.hostname,
            "HOROVOD_RANK": str(self.rank),
            "HOROVOD_SIZE": str(self.size),
            "HOROVOD_LOCAL_RANK": str(self.local_rank),
            "HOROVOD_LOCAL_SIZE": str(self.local_size),
            "HOROVOD_CROSS_RANK": str(self.cross_rank),
            "HOROVOD_CROSS_SIZE": str(self.cross_size),
        }


def horovod_slots(spec: ClusterSpec) -> tuple[HorovodSlot, ...]:
    """Every rank's Horovod fields, in global-rank order, from the job's nodes.

    This is what Horovod's ``get_host_assignments`` computes for the host list
    ``node0:n0,node1:n1,...`` in node-rank order: ranks contiguous per node, ``cross_rank``
    the position of the node among the nodes that have a rank with the same local rank (in
    node-rank order) and ``cross_size`` the number of those nodes. It needs the node list
    (:attr:`~sparktrain.layout.cluster.ClusterSpec.node_sizes`, which rank 0's task holds, where
    Horovod's rendezvous server is sized); one rank's fields are :func:`horovod_slot`'s.

    Raises:
        SparkTrainError: when ``spec`` does not hold the job's node list (a bug).
    """
    if sum(size for _, size in spec.node_sizes) != spec.world_size:
        raise SparkTrainError(f"ClusterSpec nodes {spec.node_sizes} do not make the job")
    with_local: dict[int, list[str]] = {}
    for host, size in spec.node_sizes:
        for local_rank in range(size):
            with_local.setdefault(local_rank, []).append(host)
    with_local_before: dict[int, list[str]] = {local_rank: [] for local_rank in with_local}
    slots: list[HorovodSlot] = []
    for host, size in spec.node_sizes:
        for local_rank in range(size):
            peers = with_local[local_rank]
            slots.append(
                HorovodSlot(
                    hostname=host,
                    rank=len(slots),
                    size=spec.world_size,
                    local_rank=local_rank,
                    local_size=size,
                    # Nodes are appended in order: this node is the last one so far.
                    cross_rank=len(with_local_before[local_rank]),
                    cross_size=len(peers),
                )
            )
            with_local_before[local_rank].append(host)
    return tuple(slots)


def horovod_slot(spec: ClusterSpec, rank: RankSpec) -> HorovodSlot:
    """One rank's Horovod fields (see :func:`horovod_slots`), from its own place alone.

    Local rank and size are the spec's, so ``HOROVOD_LOCAL_RANK`` always equals
    ``LOCAL_RANK``; cross rank and size were computed with the layout
    (:func:`~sparktrain.layout.cluster.build_cluster_spec`).
    """
    return HorovodSlot(
        hostname=spec.node_name(rank),
        rank=rank.rank,
        size=spec.world_size,
        local_rank=rank.local_rank,
        local_size=rank.local_world_size,
        cross_rank=rank.cross_rank,
        cross_size=rank.cross_size,
    )


def gloo_name_problem(spec: ClusterSpec) -> str | None:
    """Why Horovod's Gloo cannot connect these hosts, or None.

    Horovod 0.28.1 creates the Gloo device of its process sets (the global one included, on
    every ``hvd.init()``) without ``HOROVOD_GLOO_IFACE``: that device binds the first address
    the host's own name resolves to. Where the name resolves to loopback (``127.0.1.1 host``
    in /etc/hosts, as Debian writes it) the other hosts are told a loopback address: the
    first collective aborts with "connect [127.0.0.1]: Connection refused" on some ranks and
    the others wait in ``hvd.init()``. So such hosts are refused before any rank starts.
    """
    if spec.num_hosts < 2:
        return None  # one host: loopback reaches every rank
    bad = []
    for first in (r for r in spec.ranks if r.host_local_rank == 0):
        host, task = first.task.host, first.task
        if task.name_address is None:
            continue  # not reported
        if not task.name_address:
            bad.append(f"{host}: its name does not resolve to an address of this host")
        elif ipaddress.ip_address(task.name_address.split("%")[0]).is_loopback:
            bad.append(f"{host}: its name resolves to {task.name_address}")
    if not bad:
        return None
    return (
        "Horovod over Gloo across hosts needs each host's name (hostname) to resolve to an "
        "address the other hosts reach: Horovod binds its process sets' Gloo connections there "
        "whatever HOROVOD_GLOO_IFACE says. Not so on " + "; ".join(bad) + ". Map each host's "
        "name to its address on the cluster network (DNS, or /etc/hosts on each host); or use "
        "launcher='mpi' (spark.sparktrain.launcher mpi), or horovod_impl='builtin' "
        "(spark.sparktrain.horovodImpl builtin: sparktrain's horovod.torch on torch.distributed)"
    )


class HorovodBackend(Backend):
    """``hvd.init()`` works with no arguments; ranks meet through Horovod's Gloo rendezvous."""

    name = "horovod"

    def __init__(self) -> None:
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def check(self, config: RunConfig) -> None:
        """Fail fast on the driver when Horovod (or, for ``launcher='mpi'``, MPI) is missing.

        Raises:
            ConfigurationError: naming how to install what is missing.
        """
        if config.launcher not in LAUNCHERS:
            raise ConfigurationError(
                f"launcher={config.launcher!r} is not a Horovod launcher; use 'gloo' "
                "(the default) or 'mpi' (argument launcher=, or spark.sparktrain.launcher)"
            )
        if config.horovod_impl == "builtin":
            if config.launcher == "mpi":
                raise ConfigurationError(
                    "launcher='mpi' needs the installed Horovod, but horovod_impl='builtin' "
                    "picks sparktrain's built-in horovod.torch: use launcher='gloo', or "
                    f"horovod_impl='horovod' ({conf_key('horovod_impl')})"
                )
            return
        if config.horovod_impl is None and config.launcher != "mpi":
            return  # auto: Horovod where the ranks find it, else the built-in one
        if installed_horovod() is None:
            raise ConfigurationError(f"Horovod is not installed. {INSTALL_HINT}")
        library = horovod_torch_library()
        if library is None:
            raise ConfigurationError(
                "Horovod is installed but without its PyTorch extension (horovod.torch). "
                "Rebuild it: HOROVOD_FORCE=1 sparktrain install-horovod, or pip uninstall "
                "horovod and pip install --no-cache-dir --no-build-isolation horovod with "
                f"HOROVOD_WITH_PYTORCH=1 (torch installed first). {INSTALL_HINT}"
            )
        if config.launcher == "mpi":
            self._check_mpi(library)

    @staticmethod
    def _check_mpi(library: Path) -> None:
        if shutil.which("mpirun") is None:
            raise ConfigurationError(
                "launcher='mpi' needs Open MPI's mpirun on PATH (on the driver and every "
                "executor host): apt-get install openmpi-bin libopenmpi-dev, then rebuild "
                "Horovod with MPI (HOROVOD_FORCE=1 sparktrain install-horovod); or use "
                "launcher='gloo', which needs no MPI"
            )
        if not _links_mpi(library):
            raise ConfigurationError(
                f"launcher='mpi' needs Horovod built with MPI, and {library} is not "
                "(hvd.mpi_built() is False): rebuild it now that mpicxx is installed with "
                "HOROVOD_FORCE=1 sparktrain install-horovod (or HOROVOD_WITH_MPI=1 pip install "
                "--no-cache-dir --no-build-isolation horovod); or use launcher='gloo'"
            )

    @property
    def needs_prepare(self) -> bool:
        return True

    def layout_problem(self, spec: ClusterSpec, config: RunConfig) -> str | None:
        """Hosts whose name resolves to loopback, for Horovod's own Gloo (see
        :func:`gloo_name_problem`); mpirun and the built-in ``horovod.torch`` do not care.
        Under mpirun, nodes that are tasks (see
        :data:`~sparktrain.config.MPI_TASK_NODES`)."""
        if config.launcher == "mpi" and spec.nodes == "task":
            return f"{MPI_TASK_NODES} (here by node='auto': tasks on one host number their GPUs)"
        if config.launcher == "mpi" or builtin_reason(config) is not None:
            return None
        return gloo_name_problem(spec)

    def prepare(self, spec: ClusterSpec, config: RunConfig) -> dict[str, str]:
        """Start Horovod's HTTP rendezvous server for this spec, where rank 0 runs; or, when
        the ranks use the built-in ``horovod.torch`` (see :func:`builtin_reason`), nothing.

        Returns:
            ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` (rank 0's host) and ``..._PORT``; or
            :data:`~sparktrain.contract.HOROVOD_SHIM_ENV` with the reason for the built-in one.
        """
        self.teardown()
        reason = builtin_reason(config)
        if reason is not None:
            return {contract.HOROVOD_SHIM_ENV: reason}
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHTTPServer

        from sparktrain.backends.horovod_store import rendezvous_handler

        plan = [SlotInfo(**dataclasses.asdict(slot)) for slot in horovod_slots(spec)]
        try:
            # Bind to the address the ranks are told, not every interface: the store is
            # unauthenticated (Horovod's C++ client cannot sign requests).
            server = RendezvousHTTPServer((spec.master_addr, 0), rendezvous_handler(), 0)
        except OSError:
            if is_loopback(spec.master_addr):
                raise  # a run on loopback alone never listens beyond it
            server = RendezvousHTTPServer(("", 0), rendezvous_handler(), 0)
        server.init(plan)
        thread = threading.Thread(
            target=server.serve_forever, name="sparktrain-horovod-rendezvous", daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread
        return {ADDR_KEY: spec.master_addr, PORT_KEY: str(server.server_address[1])}

    def env(
        self, spec: ClusterSpec, rank: RankSpec, shared: Mapping[str, str], config: RunConfig
    ) -> dict[str, str]:
        if config.launcher == "mpi":
            # Under mpirun, hvd.init() takes rank, size and locality from MPI itself.
            env = {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"}
            env.update(interface_env(rank))
            return env
        if contract.HOROVOD_SHIM_ENV in shared:
            env = horovod_slot(spec, rank).env()
            env.update(
                {
                    contract.HOROVOD_SHIM_ENV: shared[contract.HOROVOD_SHIM_ENV],
                    "MASTER_ADDR": spec.master_addr,
                    "MASTER_PORT": str(spec.master_port),
                }
            )
            env.update({**loopback_env(spec), **interface_env(rank)})
            return env
        if ADDR_KEY not in shared or PORT_KEY not in shared:
            raise SparkTrainError(f"the Horovod rendezvous address is missing from {dict(shared)}")
        env = horovod_slot(spec, rank).env()
        env.update(
            {
                ADDR_KEY: shared[ADDR_KEY],
                PORT_KEY: shared[PORT_KEY],
                # As under torchrun: a free port of rank 0's host, for torch.distributed
                # (env://) beside Horovod.
                "MASTER_ADDR": spec.master_addr,
                "MASTER_PORT": str(spec.master_port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                # Horovod waits 30 s by default for peers at hvd.init(); ranks that import
                # torch on busy executors can take longer to get there.
                "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(30, math.ceil(config.start_timeout))),
            }
        )
        env.update({**loopback_env(spec), **interface_env(rank)})
        if "GLOO_SOCKET_IFNAME" in env:
            env["HOROVOD_GLOO_IFACE"] = env["GLOO_SOCKET_IFNAME"]
        return env

    def env_defaults(self, env: Mapping[str, str]) -> dict[str, str]:
        if contract.HOROVOD_SHIM_ENV not in env:
            return {}
        # The built-in horovod.torch runs torch.distributed: the torch backend's defaults.
        return collective_defaults(env)

    def teardown(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        try:
            server.shutdown()
        finally:
            server.server_close()
            if thread is not None:
                thread.join(timeout=5)
