"""The collectives as ``hvd.allreduce`` & co. give them: differentiable through autograd, with
the gradients Horovod defines.

- allreduce: the gradient is the same allreduce (op and scale factors) of the output's
  gradient;
- allgather: the average over the ranks of the output's gradient, this rank's rows of it;
- broadcast: the average over the ranks of the output's gradient on the root, zeros elsewhere;
- alltoall: the output's gradient sent back with the received splits;
- reducescatter: the output's gradient (times ``size()`` for Sum, times the scale factors)
  gathered from every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sparktrain.hvdcompat import collectives, grouped, scatter
from sparktrain.hvdcompat.collectives import Average, Sum
from sparktrain.hvdcompat.compression import Compression, Compressor
from sparktrain.hvdcompat.process_sets import scope_of


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
        ctx.options = options
        return collectives.allreduce_async(tensor, **options).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        options = {k: v for k, v in ctx.options.items() if k != "name"}
        return collectives.allreduce_async(grad.contiguous(), **options).wait(), None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> torch.Tensor:
    """The reduction of ``tensor`` over all processes, as a new tensor (``hvd.allreduce``).

    Example:
        >>> avg_loss = hvd.allreduce(torch.tensor(loss), name="avg_loss")  # doctest: +SKIP

    Args:
        tensor: the same shape and dtype on every process.
        average: deprecated; ``True`` is ``op=Average``, ``False`` is ``op=Sum``.
        name: the operation's name; the same on every process.
        compression: applied before the reduction and undone after it.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        prescale_factor: multiplies each input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks to reduce over (an ``hvd.ProcessSet`` this rank is in);
            every rank by default.

    Raises:
        HorovodInternalError: on every process, when the processes' inputs do not fit.
        NotImplementedError: for ``op=Adasum``.
        ValueError: when this rank is not in ``process_set``.
    """
    compressed, ctx = compression.compress(tensor)
    options = {
        "average": average,
        "name": name,
        "op": op,
        "prescale_factor": prescale_factor,
        "postscale_factor": postscale_factor,
        "process_set": process_set,
    }
    out = _Allreduce.apply(compressed, options)
    return compression.decompress(out, ctx)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: Any) -> Any:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return collectives.allgather_async(tensor, name, process_set).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        process_set = ctx.process_set
        averaged = collectives.allreduce_async(
            grad.contiguous(), op=Average, process_set=process_set
        ).wait()
        rows = collectives.allgather(torch.tensor([ctx.rows]), process_set=process_set).tolist()
        offset = sum(rows[: scope_of(process_set, "allgather").rank])
        return averaged.narrow(0, offset, ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> Any:
    """Every process's ``tensor`` concatenated along the first dimension, in rank order.

    The first dimension may differ between processes; the others, and the dtype, must agree
    (else :class:`HorovodInternalError` on every rank).
    """
    return _Allgather.apply(tensor, name, process_set)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root: int, name: str | None, process_set: Any
    ) -> torch.Tensor:
        ctx.root = root
        ctx.process_set = process_set
        return collectives.broadcast_async(tensor, root, name, process_set).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        process_set = ctx.process_set
        averaged = collectives.allreduce_async(
            grad.contiguous(), op=Average, process_set=process_set
        ).wait()
        scope = scope_of(process_set, "broadcast")
        if scope.ranks[scope.rank] != ctx.root:
            averaged = averaged * 0
        return averaged, None, None, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """``root_rank``'s ``tensor``, as a new tensor on every process."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None, process_set: Any
    ) -> Any:
        output, received = scatter.alltoall_async(tensor, splits, name, process_set).wait()
        ctx.received = received
        ctx.process_set = process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> Any:
        back, _ = scatter.alltoall_async(
            grad.contiguous(), ctx.received, process_set=ctx.process_set
        ).wait()
        return back, None, None, None


def alltoall(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None
) -> Any:
    """Scatter rows of ``tensor`` to every rank and gather theirs (``hvd.alltoall``).

    Returns:
        The received rows, in rank order; with ``splits``, also the rows received from each
        rank, as Horovod returns them.

    Raises:
        InvalidArgumentError: (a ``ValueError``) on a rank whose splits do not fit its tensor.
        HorovodInternalError: on the other ranks then, and on every rank for inputs that do
            not fit together.
    """
    return _Alltoall.apply(tensor, splits, name, process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
        ctx.options = options
        return scatter.reducescatter_async(tensor, **options).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        options = ctx.options
        process_set = options["process_set"]
        if options["op"] == Sum:
            grad = grad * scope_of(process_set, "reducescatter").size
        for factor in (options["prescale_factor"], options["postscale_factor"]):
            if factor != 1.0:
                grad = grad * factor
        return collectives.allgather(grad.contiguous(), process_set=process_set), None


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """This rank's rows of the reduction of ``tensor`` over every rank (``hvd.reducescatter``).

    Raises:
        HorovodInternalError: on every rank, for mismatched inputs or a 0-dimensional tensor.
    """
    compressed, ctx = compression.compress(tensor)
    options = {
        "name": name,
        "op": op,
        "process_set": process_set,
        "prescale_factor": prescale_factor,
        "postscale_factor": postscale_factor,
    }
    return compression.decompress(_Reducescatter.apply(compressed, options), ctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, options: dict[str, Any], *tensors: torch.Tensor) -> Any:
        ctx.options = options
        return tuple(grouped.grouped_allreduce_async(list(tensors), **options).wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        options = {k: v for k, v in ctx.options.items() if k != "name"}
        contiguous = [g.contiguous() for g in grads]
        return (None, *grouped.grouped_allreduce_async(contiguous, **options).wait())


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> list[torch.Tensor]:
    """The reduction of each tensor of ``tensors`` over all processes, as new tensors."""
    packed = [compression.compress(t) for t in tensors]
    options = {
        "average": average,
        "name": name,
        "op": op,
        "prescale_factor": prescale_factor,
        "postscale_factor": postscale_factor,
        "process_set": process_set,
    }
    outs = _GroupedAllreduce.apply(options, *[t for t, _ in packed])
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outs, packed, strict=True)]


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: Any = None
) -> list[torch.Tensor]:
    """:func:`allgather` of each tensor (each differentiable), as a list."""
    return [allgather(t, process_set=process_set) for t in tensors]


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """:func:`reducescatter` of each tensor (each differentiable), as a list."""
    return [
        reducescatter(t, None, compression, op, process_set, prescale_factor, postscale_factor)
        for t in tensors
    ]
