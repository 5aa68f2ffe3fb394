"""torch.distributed backend: the ``env://`` rendezvous variables, nothing to start."""

from __future__ import annotations

import importlib.metadata
import ipaddress
import socket
from collections.abc import Mapping

import psutil

from sparktrain import contract
from sparktrain.backends.base import Backend, interface_env
from sparktrain.config import RunConfig
from sparktrain.errors import ConfigurationError
from sparktrain.layout.cluster import ClusterSpec, RankSpec

# A collective that times out (init_process_group's timeout, 10 minutes for NCCL by default)
# or fails ends the rank's process instead of leaving it blocked, as torchrun sets it. Each
# value is set under the first of its names unless any of them (older torch reads the later
# ones) is set already.
COLLECTIVE_DEFAULTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"), "1"),
)
# On a rank with GPUs: torch's NCCL flight recorder keeps each group's last 2,000 collectives
# (older versions keep none unless told), so that the trace the rank writes when its stack is
# asked for (sparktrain.worker.nccl_trace) has something in it. Its variable is
# TORCH_FR_BUFFER_SIZE from torch 2.8; the older name, TORCH_NCCL_TRACE_BUFFER_SIZE, still
# works there but makes every rank print a deprecation warning, so it is set only for older
# versions (see flight_recorder_names).
FLIGHT_RECORDER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_names(version: str | None = None) -> tuple[str, ...]:
    """The flight recorder's variable names, the one to set first, for torch ``version``
    (default: the installed one, read without importing torch)."""
    if version is None:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return FLIGHT_RECORDER
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return FLIGHT_RECORDER
    return FLIGHT_RECORDER if (major, minor) >= (2, 8) else FLIGHT_RECORDER[::-1]


def collective_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's defaults for a rank with environment ``env`` (so far): each unless
    one of its names is set already; the GPU ones only where ``CUDA_VISIBLE_DEVICES`` names
    devices."""
    gpu = ((flight_recorder_names(), "2000"),) if env.get("CUDA_VISIBLE_DEVICES") else ()
    defaults = COLLECTIVE_DEFAULTS + gpu
    return {names[0]: value for names, value in defaults if env.keys().isdisjoint(names)}


class TorchBackend(Backend):
    """``dist.init_process_group(sparktrain.default_backend())`` works with no arguments."""

    name = "torch"

    def check(self, config: RunConfig) -> None:
        if config.launcher not in (None, "torch"):
            raise ConfigurationError(
                f"launcher={config.launcher!r} is a Horovod setting; the torch backend starts "
                "one process per rank itself (leave launcher unset, or use backend='horovod')"
            )

    def env(
        self, spec: ClusterSpec, rank: RankSpec, shared: Mapping[str, str], config: RunConfig
    ) -> dict[str, str]:
        env = {
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(spec.master_port),
        }
        env.update({**loopback_env(spec), **interface_env(rank)})
        return env

    def env_defaults(self, env: Mapping[str, str]) -> dict[str, str]:
        return collective_defaults(env)


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or a name) is a loopback address."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


def loopback_interface() -> str:
    """The name of this host's loopback interface (``lo`` on Linux)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and is_loopback(a.address) for a in addresses):
            return name
    return "lo"


def loopback_env(spec: ClusterSpec) -> dict[str, str]:
    """For ranks that meet on a loopback address (``np < 0``): every listener they open stays
    on loopback. Rank 0 binds the process group's store to ``MASTER_ADDR`` (see
    :mod:`sparktrain.worker.bound_store`), and Gloo and NCCL bind to the loopback interface
    rather than to the address the host's name resolves to."""
    if not is_loopback(spec.master_addr):
        return {}
    name = loopback_interface()
    return {contract.BOUND_STORE_ENV: "1", "GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
