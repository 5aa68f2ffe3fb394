"""The one small interface every backend implements, and the environment all ranks share."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar

from sparktrain import contract
from sparktrain.cluster import ClusterSpec, RankSpec, shared_gpu_ids
from sparktrain.config import RunConfig


class Backend(abc.ABC):
    """How ranks find each other.

    The runner calls :meth:`check` on the driver before anything starts; after rendezvous the
    task that runs rank 0 (or the local supervisor) calls :meth:`prepare` once and every rank's
    environment is :func:`rank_env` plus :meth:`env`, and :meth:`env_defaults` where nothing
    set those variables already; :meth:`teardown` runs where
    :meth:`prepare` ran, when the ranks have ended.
    """

    name: ClassVar[str]

    def check(self, config: RunConfig) -> None:  # noqa: B027 - optional hook
        """Raise ConfigurationError on the driver if this backend cannot run ``config``."""

    @property
    def needs_prepare(self) -> bool:
        """Whether :meth:`prepare` does anything (saves a second barrier round when not)."""
        return False

    def layout_problem(self, spec: ClusterSpec, config: RunConfig) -> str | None:
        """Why this backend cannot run on ``spec``'s hosts, or None; asked on the driver once
        every task has arrived, before any rank starts."""
        return None

    def prepare(self, spec: ClusterSpec, config: RunConfig) -> dict[str, str]:
        """Start what the ranks need (e.g. a rendezvous server); return values every rank gets."""
        return {}

    @abc.abstractmethod
    def env(
        self, spec: ClusterSpec, rank: RankSpec, shared: Mapping[str, str], config: RunConfig
    ) -> dict[str, str]:
        """The backend's environment variables for one rank."""

    def env_defaults(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables a rank gets unless ``env``, its environment so far (the process's own,
        sparktrain's and the user's ``env``), already says otherwise."""
        return {}

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Stop what :meth:`prepare` started."""


def visible_devices(spec: ClusterSpec, rank: RankSpec) -> list[str]:
    """GPU addresses a rank sees, ordered so that device ``local_rank`` is its own.

    Every rank on a host sees the GPUs of all ranks on that host, ordered by local rank, so
    both ``cuda:{LOCAL_RANK}`` (DDP tutorials) and ``hvd.local_rank()`` pinning select the GPU
    Spark assigned to this rank. A task that holds k GPUs runs k ranks, one per GPU, each a
    slot of its own here, so the same holds for it. Where tasks on one host report the same
    GPU id (containers that each number their GPUs from 0), each rank sees its own task's
    GPUs only, in slot order, since "0,0" would read as no GPU at all; such layouts pin by
    ``torch.cuda.current_device()`` (set by the worker) instead.
    """
    peers = spec.on_host(rank.task.host)
    if shared_gpu_ids([peer.task for peer in peers]):
        # The tasks number their GPUs each on their own (separate containers): a rank sees
        # the GPUs of its own Spark task, as device 0 onwards.
        mine = [p for p in peers if p.task.first_index == rank.task.first_index]
        return [gpu for peer in sorted(mine, key=lambda p: p.task.slot) for gpu in peer.task.gpus]
    devices: list[str] = []
    for peer in peers:
        devices.extend(peer.task.gpus)
    return devices


def rank_env(spec: ClusterSpec, rank: RankSpec, config: RunConfig) -> dict[str, str]:
    """Variables every rank gets whatever the backend: its place, threads and devices."""
    env = {
        "RANK": str(rank.rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(rank.local_rank),
        "LOCAL_WORLD_SIZE": str(rank.local_world_size),
        "NODE_RANK": str(rank.node_rank),
        "GROUP_RANK": str(rank.node_rank),
        "OMP_NUM_THREADS": str(max(1, rank.task.cpus)),
        contract.HOST_ENV: rank.task.host,
        contract.RANK0_HOST_ENV: spec.master_addr,
    }
    own_gpus = rank.task.gpus
    if config.use_gpu is False or not own_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        visible = visible_devices(spec, rank)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        env[contract.DEVICE_INDEX_ENV] = str(visible.index(own_gpus[0]))
    return env


def interface_env(rank: RankSpec) -> dict[str, str]:
    """Socket interface hints for Gloo and NCCL, when the task's interface is known."""
    if not rank.task.ifname:
        return {}
    name = rank.task.ifname
    return {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
