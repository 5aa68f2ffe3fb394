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

With NCCL (a group whose backend is one of :data:`QUEUED_BACKENDS`), a blocking collective
returns once it is queued on the GPU, and its work's future completes then too: a rank waiting
for a peer blocks later, at its next synchronization with the GPU (``.item()``), outside the
function. So on such a group every collective function that takes ``async_op`` is issued with
``async_op=True`` (then waited for, as torch does, when the caller asked for a blocking call),
and it counts as completed only once its work says so (``Work.is_completed()``: for NCCL, once
the GPU has run it), looked at after each wait and every second while any is outstanding (see
:mod:`sparktrain.worker.outstanding`). A rank whose collective has not finished on the GPU is
inside it. The functions without ``async_op`` (the ``*_object`` ones), and collectives issued
while the stream is captured into a CUDA graph, count as before. This NCCL path has been run
here on CPUs alone (Gloo standing in for NCCL), not yet on a GPU.
"""

from __future__ import annotations

import functools
import inspect
import mmap
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sparktrain import contract
from sparktrain.worker.import_hooks import PatchOnImport
from sparktrain.worker.outstanding import Outstanding

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
# Backends whose blocking collectives return once queued on the device, not once done: a group
# whose backend's name holds one of these has its collectives counted by their works.
QUEUED_BACKENDS: tuple[str, ...] = ("nccl",)


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
        # Queued collectives (NCCL) not yet run on the device.
        self.outstanding = Outstanding(self.leave)

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
    place = _async_place(fn)

    @functools.wraps(fn)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if (
            place is not None
            and is_queued(_argument(args, kwargs, place[1], "group"))
            and not _capturing()
        ):
            return _issue_queued(fn, counters, place[0], args, kwargs)
        work = _entered(fn, counters, args, kwargs)
        future = None if work is None else _future_of(work)
        if future is None:
            counters.leave()
        else:
            future.add_done_callback(counters.leave)
        return work

    setattr(collective, _WRAPPED, True)
    return collective


def _async_place(fn: Callable[..., Any]) -> tuple[int | None, int | None] | None:
    """Where ``fn`` takes ``async_op`` and ``group`` positionally (None: only by keyword), or
    None when it takes no ``async_op``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if "async_op" not in {p.name for p in params}:
        return None

    def index(name: str) -> int | None:
        return positional.index(name) if name in positional else None

    return index("async_op"), index("group")


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int | None, name: str) -> Any:
    if index is not None and index < len(args):
        return args[index]
    return kwargs.get(name)


def backend_name(group: Any) -> str:
    """The backend of ``group`` (None: the default group) as torch names it; "" if unknown."""
    dist = sys.modules.get("torch.distributed")
    try:
        return str(dist.get_backend(group)) if dist is not None else ""
    except (ValueError, RuntimeError, TypeError, AttributeError):
        pass  # not initialized, or a group made by hand outside torch's world
    name = getattr(group, "name", None)
    try:
        return str(name()) if callable(name) else ""
    except (RuntimeError, TypeError):
        return ""


def is_queued(group: Any) -> bool:
    """Whether ``group``'s blocking collectives return once queued (see QUEUED_BACKENDS)."""
    name = backend_name(group).lower()
    return any(backend in name for backend in QUEUED_BACKENDS)


def _capturing() -> bool:
    """Whether this thread's CUDA stream is being captured into a graph: a collective issued
    then runs when the graph is replayed, so it is counted as it returns, as before."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return bool(cuda.is_current_stream_capturing()) if cuda is not None else False
    except (RuntimeError, AttributeError):
        return False


def _issue_queued(
    fn: Callable[..., Any],
    counters: Counters,
    index: int | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Issue ``fn`` with ``async_op=True``, counted completed when its work is; wait for it
    (as torch does for a blocking call) unless the caller asked for ``async_op``."""
    wanted_async = bool(_argument(args, kwargs, index, "async_op"))
    if index is not None and index < len(args):
        args = (*args[:index], True, *args[index + 1 :])
    else:
        kwargs = {**kwargs, "async_op": True}
    work = _entered(fn, counters, args, kwargs)
    if work is None:  # this rank is not in the group: nothing was issued
        counters.leave()
        return None
    counters.outstanding.add(work)
    if wanted_async:
        return work
    try:
        work.wait()
    except BaseException:
        counters.outstanding.drop(work)
        raise
    counters.outstanding.settle()  # done already where the wait waited for it (Gloo, barrier)
    return None


def _entered(
    fn: Callable[..., Any], counters: Counters, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``fn(*args, **kwargs)`` counted as entered; one that raises counts as left too."""
    counters.enter()
    try:
        return fn(*args, **kwargs)
    except BaseException:
        counters.leave()
        raise


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
