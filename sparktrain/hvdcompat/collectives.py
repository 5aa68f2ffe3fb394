"""Horovod's collectives (allreduce, allgather, broadcast, their objects and async forms) on
torch.distributed.

Results follow Horovod's arithmetic: ``op=Average`` sums the (prescaled) tensors and
multiplies the sum by ``postscale_factor / size()``, as Horovod's backend does.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from sparktrain.hvdcompat.basics import _checked, comm_device
from sparktrain.hvdcompat.compression import Compression, Compressor

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


def _finish_reduce(buffer: torch.Tensor, op: int, postscale_factor: float) -> None:
    """The scaling Horovod applies after the reduction, in place."""
    factor = postscale_factor / _checked().size if op == Average else postscale_factor
    if factor == 1.0:
        return
    if buffer.dtype.is_floating_point or buffer.dtype.is_complex:
        buffer.mul_(factor)
    else:
        buffer.copy_(torch.floor(buffer.double() * factor).to(buffer.dtype))


class Handle:
    """An operation in flight (what Horovod's ``*_async`` functions return)."""

    def __init__(self, work: Any, finish: Callable[[], torch.Tensor]) -> None:
        self._work = work
        self._finish = finish
        self._result: torch.Tensor | None = None

    def poll(self) -> bool:
        """Whether the operation has completed."""
        return self._result is not None or self._work is None or bool(self._work.is_completed())

    def wait(self) -> torch.Tensor:
        """Wait for the operation and return its output."""
        if self._result is None:
            if self._work is not None:
                self._work.wait()
            self._result = self._finish()
        return self._result


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> Handle:
    """Start reducing ``tensor`` over all processes, in place; see :func:`allreduce`."""
    _no_process_set(process_set, "allreduce")
    op = resolve_op(op, average)
    _checked()
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    work = dist.all_reduce(tensor, op=_TORCH_OPS[op], async_op=True)

    def finish() -> torch.Tensor:
        _finish_reduce(tensor, op, postscale_factor)
        return tensor

    return Handle(work, finish)


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
    """The reduction of ``tensor`` over all processes, as a new tensor.

    Example:
        >>> avg_loss = hvd.allreduce(torch.tensor(loss), name="avg_loss")  # doctest: +SKIP

    Args:
        tensor: the same shape and dtype on every process.
        average: deprecated; ``True`` is ``op=Average``, ``False`` is ``op=Sum``.
        name: a label in Horovod; accepted and unused here.
        compression: applied before the reduction and undone after it.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        prescale_factor: multiplies each input before the reduction.
        postscale_factor: multiplies the result.
        process_set: only the global set is supported.

    Raises:
        NotImplementedError: for ``op=Adasum`` or a process set.
    """
    compressed, ctx = compression.compress(tensor.detach().clone())
    out = allreduce_async_(
        compressed, average, name, op, prescale_factor, postscale_factor, process_set
    ).wait()
    return compression.decompress(out, ctx)


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
    _no_process_set(process_set, "broadcast")
    _check_root(root_rank)
    work = dist.broadcast(tensor, src=root_rank, async_op=True)
    return Handle(work, lambda: tensor)


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


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """``root_rank``'s ``tensor``, as a new tensor on every process."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> Any:
    """Every process's ``tensor`` concatenated along the first dimension, in rank order.

    The first dimension may differ between processes; the others must agree.
    """
    _no_process_set(process_set, "allgather")
    n = _checked().size
    local = tensor.detach().contiguous()
    if local.dim() == 0:
        local = local.reshape(1)
    lengths = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    all_lengths = [torch.zeros_like(lengths) for _ in range(n)]
    dist.all_gather(all_lengths, lengths)
    sizes = [int(t.item()) for t in all_lengths]
    longest = max(sizes)
    padded = local
    if local.shape[0] < longest:
        pad = local.new_zeros((longest - local.shape[0], *local.shape[1:]))
        padded = torch.cat([local, pad])
    parts = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:length] for part, length in zip(parts, sizes, strict=True)])


def _to_bytes(obj: Any) -> torch.Tensor:
    data = io.BytesIO()
    cloudpickle.dump(obj, data)
    return torch.frombuffer(bytearray(data.getvalue()), dtype=torch.uint8)


def _from_bytes(tensor: torch.Tensor) -> Any:
    return cloudpickle.loads(tensor.cpu().numpy().tobytes())


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None
) -> Any:
    """``root_rank``'s ``obj`` (anything cloudpickle can pickle), on every process."""
    _no_process_set(process_set, "broadcast_object")
    _check_root(root_rank)
    device = comm_device()
    is_root = _checked().rank == root_rank
    payload = _to_bytes(obj).to(device) if is_root else None
    length = torch.tensor([payload.numel() if payload is not None else 0], device=device)
    dist.broadcast(length, src=root_rank)
    if payload is None:
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=root_rank)
    return obj if is_root else _from_bytes(payload)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every process's ``obj``, as a list in rank order."""
    _no_process_set(process_set, "allgather_object")
    _checked()
    payload = _to_bytes(obj).to(comm_device())
    gathered = allgather(payload)
    lengths = allgather(torch.tensor([payload.numel()], device=payload.device)).tolist()
    out, start = [], 0
    for length in lengths:
        out.append(_from_bytes(gathered[start : start + length]))
        start += length
    return out


def barrier(process_set: Any = None) -> None:
    """Wait until every process has reached this call."""
    _no_process_set(process_set, "barrier")
    _checked()
    dist.barrier()


def join(device: int = -1) -> int:
    """Wait until every process has called join(); returns the rank that joined last.

    Unlike Horovod, processes that have joined do not stand in for later collectives of the
    others: every process must call join() at the same point (typically after training).
    """
    _checked()
    arrived = allgather(torch.tensor([time.time()], dtype=torch.float64, device=comm_device()))
    return int(torch.argmax(arrived).item())


def _check_root(root_rank: int) -> None:
    n = _checked().size
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank={root_rank} is not a rank of this job (0..{n - 1})")


def _no_process_set(process_set: Any, function: str) -> None:
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise NotImplementedError(
            f"hvd.{function}(process_set=...) is not supported by sparktrain's built-in "
            "horovod.torch: only the global process set is"
        )
