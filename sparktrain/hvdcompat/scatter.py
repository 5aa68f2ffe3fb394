"""Horovod's ``alltoall`` and ``reducescatter`` (and their async forms) on torch.distributed.

Both agree on their inputs first, as every collective here does (see
:mod:`sparktrain.hvdcompat.matching`). ``reducescatter`` reduces the whole tensor and keeps
this rank's rows, so every value is the one Horovod computes (the same scaling arithmetic);
rows are dealt as Horovod deals them: ``dim0 // size`` each, one more for the first
``dim0 % size`` ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sparktrain.hvdcompat.basics import comm_device
from sparktrain.hvdcompat.collectives import (
    _TORCH_OPS,
    Average,
    Sum,
    _after,
    _finish_reduce,
    resolve_op,
)
from sparktrain.hvdcompat.dtypes import check_scalable, for_moving, for_reduction, restore, scale
from sparktrain.hvdcompat.exceptions import HorovodInternalError, InvalidArgumentError
from sparktrain.hvdcompat.handles import Handle, claim
from sparktrain.hvdcompat.matching import Agreement, submit
from sparktrain.hvdcompat.negotiate import Request
from sparktrain.hvdcompat.process_sets import scope_of


def _splits_problem(tensor: torch.Tensor, splits: Any, n: int) -> tuple[list[int], str | None]:
    """Rows to send to each rank, and what is wrong with ``splits`` (None: nothing)."""
    rows = tensor.shape[0] if tensor.dim() else 0
    if tensor.dim() == 0:
        return [], "hvd.alltoall needs a tensor with at least one dimension"
    if splits is None:
        if rows % n:
            return [], (
                f"hvd.alltoall without splits deals the first dimension equally, but {rows} "
                f"rows do not divide among {n} ranks: pass splits="
            )
        return [rows // n] * n, None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            return [], f"hvd.alltoall's splits must be integers, not {splits.dtype}"
        values = [int(v) for v in splits.reshape(-1).tolist()]
    else:
        values = [int(v) for v in splits]
    if len(values) != n or any(v < 0 for v in values) or sum(values) != rows:
        return [], (
            f"hvd.alltoall's splits {values} must give one count >= 0 per rank ({n}) adding up "
            f"to the first dimension ({rows})"
        )
    return values, None


def alltoall_async(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None
) -> Handle:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank ``i``; ``synchronize(handle)``
    returns ``(received rows in rank order, rows received from each rank)``."""
    scope = scope_of(process_set, "alltoall")
    n = scope.size
    local = tensor.detach().contiguous()
    sent, problem = _splits_problem(local, splits, n)
    key = claim("alltoall", name)
    # A rank whose splits are wrong still takes part in the agreement, so that every rank
    # raises rather than waits.
    request = Request("alltoall", name, local, op=1 if problem else 0)

    def refuse(exc: HorovodInternalError) -> BaseException:
        # The rank that refused its splits says why; the others say which rank refused.
        return InvalidArgumentError(problem) if problem else exc

    def start(agreement: Agreement) -> tuple[Any, Any]:
        if problem:
            raise HorovodInternalError(problem)
        counts = torch.tensor(sent, dtype=torch.int64, device=comm_device(local))
        matrix = [torch.empty_like(counts) for _ in range(n)]
        dist.all_gather(matrix, counts, group=scope.group)
        received = [int(row[scope.rank]) for row in matrix]
        moved = for_moving(local)
        output = moved.new_empty((sum(received), *local.shape[1:]))
        work = dist.all_to_all_single(
            output, moved, received, sent, group=scope.group, async_op=True
        )
        split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

        def finish() -> tuple[torch.Tensor, torch.Tensor]:
            return restore(output, local.dtype), torch.tensor(received, dtype=split_dtype)

        return work, finish

    return submit(request, scope.group, start, key, refuse)


def _rows_of(dim0: int, rank: int, n: int) -> tuple[int, int]:
    """The first row and row count of ``rank``'s share of ``dim0`` rows, as Horovod deals."""
    base, extra = divmod(dim0, n)
    start = rank * base + min(rank, extra)
    return start, base + (1 if rank < extra else 0)


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start reducing ``tensor`` over every rank, keeping this rank's rows of the result."""
    op = resolve_op(op)
    scope = scope_of(process_set, "reducescatter")
    key = claim("reducescatter", name)
    local = tensor.detach()
    request = Request("reducescatter", name, local, op, -1, prescale_factor, postscale_factor)

    def start(agreement: Agreement) -> tuple[Any, Any]:
        if local.dim() == 0:
            raise HorovodInternalError("hvd.reducescatter needs a tensor with a first dimension")
        if op not in (Average, Sum):
            raise HorovodInternalError("hvd.reducescatter supports op=hvd.Average or hvd.Sum")
        check_scalable(local.dtype, prescale_factor, _after(op, postscale_factor, scope.size))
        whole = local.clone()
        scale(whole, prescale_factor)
        buffer = for_reduction(whole)
        work = dist.all_reduce(buffer, op=_TORCH_OPS[op], group=scope.group, async_op=True)
        first, count = _rows_of(local.shape[0], scope.rank, scope.size)

        def finish() -> torch.Tensor:
            mine = buffer[first : first + count].to(local.dtype).clone()
            _finish_reduce(mine, op, postscale_factor, scope.size)
            return mine

        return work, finish

    return submit(request, scope.group, start, key)
