"""The ``horovod.torch`` namespace of sparktrain's built-in implementation.

``import horovod.torch as hvd`` on a rank that uses the built-in implementation gives this
module's names. Other functions of Horovod's API raise NotImplementedError naming
themselves, so a script learns at once what it needs that is missing here.
"""

from __future__ import annotations

import importlib
from typing import Any

from sparktrain.hvdcompat.autograd import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from sparktrain.hvdcompat.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
)
from sparktrain.hvdcompat.batchnorm import SyncBatchNorm
from sparktrain.hvdcompat.collectives import (
    Adasum,
    Average,
    Handle,
    Max,
    Min,
    Product,
    Sum,
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    poll,
    synchronize,
)
from sparktrain.hvdcompat.compression import Compression, Compressor
from sparktrain.hvdcompat.exceptions import HorovodInternalError
from sparktrain.hvdcompat.functions import broadcast_optimizer_state, broadcast_parameters
from sparktrain.hvdcompat.grouped import (
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    sparse_allreduce_async,
)
from sparktrain.hvdcompat.handles import DuplicateNameError
from sparktrain.hvdcompat.lifecycle import init, shutdown
from sparktrain.hvdcompat.objects import allgather_object, barrier, broadcast_object, join
from sparktrain.hvdcompat.optimizer import DistributedOptimizer
from sparktrain.hvdcompat.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from sparktrain.hvdcompat.scatter import (
    alltoall_async,
    reducescatter_async,
)
from sparktrain.hvdcompat.timeline import start_timeline, stop_timeline

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "DuplicateNameError",
    "Handle",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "global_process_set",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]

# Names of horovod.torch that this implementation does not provide.
NOT_PROVIDED = frozenset({"mpi_lib_v2"})
# Submodules given on first use, by name: ``hvd.elastic`` writes its commits through
# sparktrain.checkpoint, a layer above this module (see tests/unit/test_layers.py).
LAZY_MODULES = {"elastic": "sparktrain.hvdcompat.elastic"}


def __getattr__(name: str) -> Any:
    """``hvd.elastic`` on first use; NotImplementedError for the parts of Horovod's API that
    are not provided."""
    if name in LAZY_MODULES:
        return importlib.import_module(LAZY_MODULES[name])
    if name in NOT_PROVIDED:
        raise NotImplementedError(
            f"hvd.{name} is not supported by sparktrain's built-in horovod.torch; install "
            "Horovod (`sparktrain install-horovod`) and run with horovod_impl='horovod' to use it"
        )
    raise AttributeError(f"module 'horovod.torch' has no attribute {name!r}")
