"""This rank's collectives, counted for the driver's hang watch.

The rank's task hands it a small file (``contract.COLLECTIVES_ENV``) holding two counts: the
collectives this rank entered and those that completed. Once ``torch.distributed`` (or
Horovod's ``horovod.torch.mpi_ops``) is imported, its collective functions are wrapped to move
them; the task reads the file now and then and tells the driver (see
:mod:`sparktrain.task.collectives`). So a collective costs two additions in shared memory under
an uncontended lock: no system call, no message.

A collective issued with ``async_op=True`` counts as entered when it is issued and as
completed when its future completes: a rank with an outstanding collective is inside one.

DistributedDataParallel's gradient all-reduce runs in C++, inside ``backward()``: a backward
pass after a forward of a DDP model that synchronizes gradients counts as one collective,
entered when the backward pass reaches the model's output and completed once DDP has waited
for its all-reduce (the backward pass's last callback). Other collectives issued from C++
without these Python functions are not seen.

With NCCL, a blocking collective returns (and so counts as completed) once it is queued on
the GPU: a rank waiting for a peer there blocks later, at its next synchronization with the
GPU, which is not counted (NCCL's watchdog and flight recorder cover that case).
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sparktrain import contract
from sparktrain.worker.import_hooks import PatchOnImport

# torch.distributed's collective functions (those a version lacks are skipped).
TORCH_COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "_broadcast_coalesced",
)
# Horovod's wait for a collective's handle: its blocking collectives call it too.
HOROVOD_WAITS = ("synchronize",)
_WRAPPED = "_sparktrain_counted"


class Counters:
    """The two counts in the file its task made, mapped into this process.

    Args:
        path: the file (``contract.COLLECTIVE_SLOT_BYTES`` long).
    """

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, contract.COLLECTIVE_SLOT_BYTES)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("Q")
        # Completions may come on another thread (a future's callback): an addition is a
        # read and a write, and a lost one would leave the rank inside a collective forever.
        self._lock = threading.Lock()

    def enter(self) -> None:
        """A collective began."""
        with self._lock:
            self._cells[0] += 1

    def leave(self, _: object = None) -> None:
        """A collective ended (returned, raised, or its future completed)."""
        with self._lock:
            self._cells[1] += 1

    def counts(self) -> tuple[int, int]:
        """(entered, completed)."""
        return self._cells[0], self._cells[1]


def counted(fn: Callable[..., Any], counters: Counters) -> Callable[..., Any]:
    """``fn`` counting each call as a collective; idempotent."""
    if getattr(fn, _WRAPPED, False):
        return fn

    @functools.wraps(fn)
    def collective(*args: Any, **kwargs: Any) -> Any:
        counters.enter()
        try:
            work = fn(*args, **kwargs)
        except BaseException:
            counters.leave()
            raise
        future = None if work is None else _future_of(work)
        if future is None:
            counters.leave()
        else:
            future.add_done_callback(counters.leave)
        return work

    setattr(collective, _WRAPPED, True)
    return collective


def _future_of(work: Any) -> Any:
    """The future of an asynchronous collective's work, or None (done, or none to wait for)."""
    get_future = getattr(work, "get_future", None)
    if get_future is None or not hasattr(work, "wait"):
        return None
    try:
        return get_future()
    except (RuntimeError, NotImplementedError):
        return None  # a backend without futures: counted as done once issued


def _wrap_all(module: ModuleType, names: tuple[str, ...], counters: Counters) -> None:
    for name in names:
        fn = getattr(module, name, None)
        if callable(fn):
            setattr(module, name, counted(fn, counters))


class _TorchFinder(PatchOnImport):
    """Wraps torch.distributed's collectives once it is imported."""


class _HorovodFinder(PatchOnImport):
    """Wraps Horovod's wait for its collectives once it is imported."""


def _patch_torch(counters: Counters) -> Callable[[ModuleType], None]:
    def patch(dist: ModuleType) -> None:
        c10d = getattr(dist, "distributed_c10d", None)
        if c10d is None:
            return
        _wrap_all(c10d, TORCH_COLLECTIVES, counters)
        for name in TORCH_COLLECTIVES:
            if hasattr(c10d, name):  # the package's names, bound before the wrapping
                setattr(dist, name, getattr(c10d, name))
            elif callable(getattr(dist, name, None)):  # the package's own (from C++)
                setattr(dist, name, counted(getattr(dist, name), counters))

    return patch


class _DdpFinder(PatchOnImport):
    """Counts DistributedDataParallel's backward passes once it is imported."""


def _patch_ddp(counters: Counters) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        ddp = getattr(module, "DistributedDataParallel", None)
        if ddp is None or getattr(ddp.forward, _WRAPPED, False):
            return
        forward = ddp.forward

        @functools.wraps(forward)
        def counted_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = forward(self, *args, **kwargs)
            if getattr(self, "require_backward_grad_sync", False):
                _count_backward(output, counters)
            return output

        setattr(counted_forward, _WRAPPED, True)
        ddp.forward = counted_forward

    return patch


def _count_backward(output: Any, counters: Counters) -> None:
    """Count the backward pass through ``output`` (a DDP model's) as one collective."""
    import torch
    from torch.autograd import Variable
    from torch.utils._pytree import tree_leaves

    if not torch.is_grad_enabled():
        return
    engine = Variable._execution_engine

    def entered(grad: Any) -> None:
        counters.enter()
        # DDP's wait for its all-reduce is a callback it queues during the pass, after this
        # one: the callback queued from this one runs after it.
        engine.queue_callback(lambda: engine.queue_callback(counters.leave))

    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            leaf.register_hook(entered)
            return


def install() -> Counters | None:
    """Count this rank's collectives when its task asked for it (else None): wrap
    torch.distributed's and Horovod's once they are imported (at once where they are)."""
    path = os.environ.get(contract.COLLECTIVES_ENV)
    if not path:
        return None
    try:
        counters = Counters(path)
    except (OSError, ValueError):
        return None  # never a reason to fail the rank: its hangs are then not seen
    _TorchFinder(frozenset({"torch.distributed"}), _patch_torch(counters)).install()
    _DdpFinder(frozenset({"torch.nn.parallel.distributed"}), _patch_ddp(counters)).install()
    _HorovodFinder(
        frozenset({"horovod.torch.mpi_ops"}),
        lambda module: _wrap_all(module, HOROVOD_WAITS, counters),
    ).install()
    return counters
