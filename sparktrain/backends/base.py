"""The one small interface every backend implements, and the environment all ranks share."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar

from sparktrain import contract
from sparktrain.config import RunConfig
from sparktrain.layout.cluster import ClusterSpec, RankSpec


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

    Every rank sees the GPUs of all ranks of its node (its host, or its Spark task: see
    :func:`~sparktrain.layout.cluster.node_rule`), ordered by local rank, so both
    ``cuda:{LOCAL_RANK}`` (DDP tutorials, and every framework that picks its device from the
    local rank) and ``hvd.local_rank()`` pinning select the GPU Spark assigned to this rank.
    A task that holds k GPUs runs k ranks, one per GPU, each a slot of its own here, so the
    same holds for it. Where a node's ids are not one numbering (``node="host"`` on tasks
    that each number their GPUs from 0, which the driver refuses), a rank sees its own task's
    GPUs only, since "0,0" would read as no GPU at all, and pins by
    ``torch.cuda.current_device()`` (set by the worker).
    """
    peers = spec.on_node(rank)
    devices = [gpu for peer in peers for gpu in peer.task.gpus]
    if len(set(devices)) < len(devices):
        mine = [p for p in peers if p.task.first_index == rank.task.first_index]
        return [gpu for peer in mine for gpu in peer.task.gpus]
    return devices


def rank_env(spec: ClusterSpec, rank: RankSpec, config: RunConfig) -> dict[str, str]:
    """Variables every rank gets whatever the backend: its place, threads and devices.

    The place is torchrun's (with one role, ``default``, so a role's ranks are the job's):
    frameworks that know torchrun read their world from it. ``LOCAL_*``, ``NODE_RANK`` and
    ``GROUP_*`` count nodes as :func:`~sparktrain.layout.cluster.node_rule` says.
    """
    env = {
        "RANK": str(rank.rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(rank.local_rank),
        "LOCAL_WORLD_SIZE": str(rank.local_world_size),
        "NODE_RANK": str(rank.node_rank),
        "GROUP_RANK": str(rank.node_rank),
        "GROUP_WORLD_SIZE": str(spec.num_nodes),
        "ROLE_NAME": contract.ROLE_NAME,
        "ROLE_RANK": str(rank.rank),
        "ROLE_WORLD_SIZE": str(spec.world_size),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        # The process group's store is rank 0's own, as with torchrun's static rendezvous.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "OMP_NUM_THREADS": str(max(1, rank.task.cpus)),
        contract.HOST_ENV: rank.task.host,
        contract.RANK0_HOST_ENV: spec.master_addr,
        contract.NUM_HOSTS_ENV: str(spec.num_hosts),
    }
    own_gpus = rank.task.gpus
    if config.use_gpu is False or not own_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        visible = visible_devices(spec, rank)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        env[contract.DEVICE_INDEX_ENV] = str(visible.index(own_gpus[0]))
    return env


def attempt_env(run_id: str, attempt: int) -> dict[str, str]:
    """torchrun's variables for one launch of a run, the same on every rank: its id (kept by
    restarts) and the number of restarts before it.

    ``TORCHELASTIC_RUN_ID`` is what Lightning and ``torch.distributed.is_torchelastic_launched``
    look for to read the ranks' world from torchrun's variables.
    """
    return {"TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": str(attempt)}


def interface_env(rank: RankSpec) -> dict[str, str]:
    """Socket interface hints for Gloo and NCCL, when the task's interface is known."""
    if not rank.task.ifname:
        return {}
    name = rank.task.ifname
    return {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
