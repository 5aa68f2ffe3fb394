"""Horovod's collectives (allreduce, allgather, broadcast: their async and in-place forms) on
torch.distributed; :mod:`sparktrain.hvdcompat.autograd` makes the API's ``hvd.allreduce``,
``hvd.allgather`` and ``hvd.broadcast`` of them, differentiable.

Every collective first agrees with the other ranks on what it is about to run (see
:mod:`sparktrain.hvdcompat.matching`), so inputs that do not fit together raise
:class:`HorovodInternalError` on every rank before any data moves. Results follow Horovod's
arithmetic (see :mod:`sparktrain.hvdcompat.dtypes`): ``op=Average`` sums the (prescaled)
tensors and multiplies the sum by ``postscale_factor / size()``, as Horovod's backend does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sparktrain.hvdcompat.basics import _checked
from sparktrain.hvdcompat.dtypes import check_scalable, for_moving, for_reduction, restore, scale
from sparktrain.hvdcompat.handles import Handle, claim
from sparktrain.hvdcompat.matching import Agreement, submit
from sparktrain.hvdcompat.negotiate import Request
from sparktrain.hvdcompat.process_sets import Scope, scope_of

# Horovod's reduction ops (the values of horovod.torch.mpi_ops.Average etc.).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_TORCH_OPS = {
    Sum: dist.ReduceOp.SUM,
    Average: dist.ReduceOp.SUM,
    Min: dist.ReduceOp.MIN,
    Max: dist.ReduceOp.MAX,
    Product: dist.ReduceOp.PRODUCT,
}
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max"}


def resolve_op(op: int | None, average: bool | None = None) -> int:
    """Horovod's ``op``, given the deprecated ``average`` flag as well.

    Raises:
        NotImplementedError: for Adasum.
        ValueError: for both ``op`` and ``average``, or an unknown op.
    """
    if op is not None and average is not None:
        raise ValueError("op and average cannot both be given; use op=hvd.Average or hvd.Sum")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            "op=hvd.Adasum is not supported by sparktrain's built-in horovod.torch; use "
            "op=hvd.Average (the default) or hvd.Sum, or install Horovod to use Adasum"
        )
    if op not in _TORCH_OPS:
        raise ValueError(f"unknown reduction op {op!r}; use hvd.Average, Sum, Min, Max or Product")
    return op


def _after(op: int, postscale_factor: float, size: int) -> float:
    """The factor Horovod applies after a reduction over ``size`` ranks (Average divides)."""
    return postscale_factor / size if op == Average else postscale_factor


def _finish_reduce(buffer: torch.Tensor, op: int, postscale_factor: float, size: int) -> None:
    """The scaling Horovod applies after the reduction, in place."""
    scale(buffer, _after(op, postscale_factor, size))


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    layout: tuple[tuple[Any, ...], ...] = (),
) -> Handle:
    """Start reducing ``tensor`` over all processes, in place; see :func:`sparktrain.hvdcompat.autograd.allreduce`.

    ``layout`` is for a group fused into ``tensor``: its members' dtypes and shapes, which
    must agree between the ranks too.
    """
    op = resolve_op(op, average)
    scope = scope_of(process_set, "allreduce")
    key = claim("allreduce", name)
    request = Request("allreduce", name, tensor, op, -1, prescale_factor, postscale_factor, layout)

    def start(agreement: Agreement) -> tuple[Any, Any]:
        check_scalable(tensor.dtype, prescale_factor, _after(op, postscale_factor, scope.size))
        scale(tensor, prescale_factor)
        buffer = for_reduction(tensor)
        work = dist.all_reduce(buffer, op=_TORCH_OPS[op], group=scope.group, async_op=True)

        def finish() -> torch.Tensor:
            if buffer is not tensor:
                tensor.copy_(buffer)
            _finish_reduce(tensor, op, postscale_factor, scope.size)
            return tensor

        return work, finish

    return submit(request, scope.group, start, key)


def allreduce_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Reduce ``tensor`` over all processes in place and return it."""
    return allreduce_async_(tensor, *args, **kwargs).wait()


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> Handle:
    """Start reducing a copy of ``tensor``; ``synchronize(handle)`` returns the result."""
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def synchronize(handle: Handle) -> torch.Tensor:
    """Wait for an async operation and return its output."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """Whether an async operation has completed."""
    return handle.poll()


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> Handle:
    """Start overwriting ``tensor`` with root's, in place."""
    scope = scope_of(process_set, "broadcast")
    _check_root(root_rank, scope)
    key = claim("broadcast", name)

    def start(agreement: Agreement) -> tuple[Any, Any]:
        work = dist.broadcast(for_moving(tensor), src=root_rank, group=scope.group, async_op=True)
        return work, lambda: tensor

    return submit(Request("broadcast", name, tensor, root=root_rank), scope.group, start, key)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s, in place, and return it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> Handle:
    """Start broadcasting a copy of ``tensor``; ``synchronize(handle)`` returns it."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = None
) -> Handle:
    """Start gathering every process's ``tensor``; ``synchronize(handle)`` returns
    :func:`allgather`'s result."""
    scope = scope_of(process_set, "allgather")
    local = tensor.detach().contiguous()
    if local.dim() == 0:
        local = local.reshape(1)
    key = claim("allgather", name)

    def start(agreement: Agreement) -> tuple[Any, Any]:
        sizes = agreement.first_dims
        longest = max(sizes)
        padded = local
        if local.shape[0] < longest:
            pad = local.new_zeros((longest - local.shape[0], *local.shape[1:]))
            padded = torch.cat([local, pad])
        moved = for_moving(padded)
        parts = [torch.empty_like(moved) for _ in range(scope.size)]
        work = dist.all_gather(parts, moved, group=scope.group, async_op=True)

        def finish() -> torch.Tensor:
            kept = [
                restore(part, local.dtype)[:length]
                for part, length in zip(parts, sizes, strict=True)
            ]
            return torch.cat(kept)

        return work, finish

    return submit(Request("allgather", name, local), scope.group, start, key)


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> Any:
    """Every process's ``tensor`` concatenated along the first dimension, in rank order (the
    ranks of ``process_set``, in its order, when one is given).

    The first dimension may differ between processes; the others, and the dtype, must agree
    (else :class:`HorovodInternalError` on every rank).
    """
    return allgather_async(tensor, name, process_set).wait()


def _check_root(root_rank: int, scope: Scope | None = None) -> None:
    n = _checked().size
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank={root_rank} is not a rank of this job (0..{n - 1})")
    if scope is not None and root_rank not in scope.ranks:
        raise ValueError(
            f"root_rank={root_rank} is not in the process set {list(scope.ranks)}: a root is "
            "given as its global rank (hvd.rank() on the root), and must be a member"
        )
