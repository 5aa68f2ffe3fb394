"""``hvd.init()``, the rank queries and the capability queries, on torch.distributed.

The process's place comes from the variables sparktrain sets on every rank of the Horovod
backend (``HOROVOD_RANK``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_CROSS_RANK``, ...), or from the
torch ones (``RANK``, ``LOCAL_RANK``, ...) where those are missing, as under torchrun. The
process group meets through ``env://`` (``MASTER_ADDR``/``MASTER_PORT``); Gloo carries CPU
tensors and, where the rank has a GPU, NCCL carries CUDA tensors.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from sparktrain import contract
from sparktrain.hvdcompat.handles import forget_all

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclasses.dataclass
class _State:
    """What ``init()`` learned; one per process (Horovod's API is process-global)."""

    rank: int = -1
    size: int = 0
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1
    owns_group: bool = False  # init() created the process group, so shutdown() ends it
    backend: str = ""


_state = _State()


@dataclasses.dataclass
class _Rendezvous:
    """The store the ranks meet through, made by the first init() and kept for the process's
    life: a later init() (after shutdown()) meets through it again under a new prefix, rather
    than binding the port anew while the old listener may still hold it."""

    store: Any = None
    where: tuple[str, int, int, int] = ("", 0, 0, 0)  # address, port, rank, size
    inits: int = 0


_rendezvous = _Rendezvous()


def _env_int(names: tuple[str, ...], default: int | None = None) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    if default is None:
        raise ValueError(
            f"hvd.init() needs this process's place in the job: none of {', '.join(names)} is "
            "set (run it through sparktrain's HorovodRunner, or set them as torchrun does)"
        )
    return default


def _uses_cuda() -> bool:
    return os.environ.get(contract.USE_GPU_ENV) != "0" and torch.cuda.is_available()


def _check_comm(comm: Any, size: int) -> None:
    """Accept ``init(comm=...)`` where it means every rank of the job in order; else refuse.

    Raises:
        NotImplementedError: for an MPI communicator.
        ValueError: for a list of ranks that is not every rank of the job, in order.
    """
    if comm is None:
        return
    if isinstance(comm, (str, bytes)) or not hasattr(comm, "__iter__"):
        raise NotImplementedError(
            "hvd.init(comm=<MPI communicator>) is not supported by sparktrain's built-in "
            "horovod.torch (no MPI underneath): call hvd.init(), and use "
            "hvd.ProcessSet([...]) with process_set= on the collectives for a subset of ranks"
        )
    ranks = list(comm)
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ValueError(f"hvd.init(comm=...) takes a list of integer ranks, not {ranks!r}")
    if ranks and ranks != list(range(size)):
        raise ValueError(
            f"hvd.init(comm={ranks}): sparktrain's built-in horovod.torch runs every process of "
            f"the job ({size}: ranks 0..{size - 1}) in one Horovod world, so comm= may only "
            "list all of them in order; for a subset, call hvd.init(process_sets=[hvd."
            f"ProcessSet({ranks})]) and pass process_set= to the collectives, or run the job "
            f"with np={len(ranks)}"
        )


def init(comm: Any = None) -> None:
    """Join the job's process group (``horovod.torch.init``); a second call does nothing.

    Args:
        comm: as in Horovod, a list of ranks: here only every rank of the job, in order (or
            an empty list, which Horovod also reads as every rank).

    Raises:
        NotImplementedError: for an MPI communicator.
        ValueError: when the environment does not say where this process belongs, or for a
            list of ranks that is not every rank of the job.
    """
    if comm is not None and _state.size:
        _check_comm(comm, _state.size)
    if _state.size:
        return
    rank = _env_int(("HOROVOD_RANK", "RANK"))
    size = _env_int(("HOROVOD_SIZE", "WORLD_SIZE"))
    _check_comm(comm, size)
    local_rank = _env_int(("HOROVOD_LOCAL_RANK", "LOCAL_RANK"), 0)
    local_size = _env_int(("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"), 1)
    cross_rank = _env_int(("HOROVOD_CROSS_RANK", "NODE_RANK", "GROUP_RANK"), rank // local_size)
    cross_size = _env_int(("HOROVOD_CROSS_SIZE",), max(1, size // local_size))
    owns = not dist.is_initialized()
    if owns:
        backend = "cpu:gloo,cuda:nccl" if _uses_cuda() else "gloo"
        dist.init_process_group(backend, store=_store(rank, size), rank=rank, world_size=size)
        # Every rank's connections are complete before any returns, so that a shutdown()
        # right after init() cannot close a connection a peer is still making.
        dist.barrier()
    elif (dist.get_rank(), dist.get_world_size()) != (rank, size):
        raise ValueError(
            f"torch.distributed is already initialized as rank {dist.get_rank()} of "
            f"{dist.get_world_size()}, but this process is rank {rank} of {size}"
        )
    _state.rank, _state.size = rank, size
    _state.local_rank, _state.local_size = local_rank, local_size
    _state.cross_rank, _state.cross_size = cross_rank, cross_size
    _state.owns_group = owns
    _state.backend = str(dist.get_backend())


def _store(rank: int, size: int) -> Any:
    """This init()'s view of the rendezvous store at ``MASTER_ADDR:MASTER_PORT``."""
    where = (
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        _env_int(("MASTER_PORT",)),
        rank,
        size,
    )
    if _rendezvous.store is None or _rendezvous.where != where:
        _rendezvous.store = dist.TCPStore(
            where[0],
            where[1],
            size,
            is_master=rank == 0,
            timeout=datetime.timedelta(minutes=30),  # torch's default for env://
            wait_for_workers=False,
        )
        _rendezvous.where = where
        _rendezvous.inits = 0
    _rendezvous.inits += 1
    # Every rank calls init() and shutdown() in the same order, so the counts agree.
    return dist.PrefixStore(f"hvd-init-{_rendezvous.inits}/", _rendezvous.store)


def shutdown() -> None:
    """Leave the process group (``horovod.torch.shutdown``); init() may be called again."""
    forget_all()
    if _state.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _state.rank, _state.size, _state.owns_group, _state.backend = -1, 0, False, ""


def is_initialized() -> bool:
    """Whether init() has run (and shutdown() has not since)."""
    return _state.size > 0


def _checked() -> _State:
    if not _state.size:
        raise ValueError(NOT_INITIALIZED)
    return _state


def rank() -> int:
    """This process's global rank."""
    return _checked().rank


def size() -> int:
    """The number of processes."""
    return _checked().size


def local_rank() -> int:
    """This process's index among the processes of its node (``LOCAL_RANK``)."""
    return _checked().local_rank


def local_size() -> int:
    """The number of processes of this node."""
    return _checked().local_size


def cross_rank() -> int:
    """This node's index among the nodes that run a process with this local rank."""
    return _checked().cross_rank


def cross_size() -> int:
    """The number of nodes that run a process with this local rank."""
    return _checked().cross_size


def is_homogeneous() -> bool:
    """Whether every node runs the same number of processes."""
    state = _checked()
    return state.local_size * state.cross_size == state.size


def mpi_threads_supported() -> bool:
    """Raises, as Horovod does when it runs on Gloo: there is no MPI underneath.

    Raises:
        ValueError: always.
    """
    raise ValueError(
        "Horovod MPI is not enabled: sparktrain's built-in horovod.torch runs on "
        "torch.distributed (Gloo/NCCL), not MPI"
    )


def mpi_enabled() -> bool:
    """False: there is no MPI underneath."""
    return False


def mpi_built() -> bool:
    """False: there is no MPI underneath."""
    return False


def gloo_enabled() -> bool:
    """True: CPU tensors travel over Gloo."""
    return True


def gloo_built() -> bool:
    """True: torch.distributed's Gloo is always there."""
    return dist.is_gloo_available()


def nccl_built() -> bool:
    """Whether torch.distributed has NCCL (GPU builds of torch)."""
    return dist.is_nccl_available()


def cuda_built() -> bool:
    """Whether torch was built with CUDA."""
    return torch.backends.cuda.is_built()


def rocm_built() -> bool:
    """Whether torch was built for ROCm."""
    return torch.version.hip is not None


def ddl_built() -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not supported."""
    return False


def comm_device(tensor: torch.Tensor | None = None) -> torch.device:
    """Where a collective's buffer must live: the tensor's device, else the group's default."""
    if tensor is not None:
        return tensor.device
    # Only a group made by the user with NCCL alone lacks Gloo for CPU buffers.
    if _checked().backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
