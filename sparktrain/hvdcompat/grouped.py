"""Horovod's grouped collectives: one call, one handle, for a list of tensors.

Each tensor travels as its own collective (each agreed on first, see
:mod:`sparktrain.hvdcompat.matching`); the group's handle waits for all of them and gives
the list of results in order. The group's ``name=`` is held as one name while it is in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sparktrain.hvdcompat.collectives import (
    Average,
    allgather_async,
    allreduce_async_,
)
from sparktrain.hvdcompat.handles import Handle, claim
from sparktrain.hvdcompat.process_sets import scope_of
from sparktrain.hvdcompat.scatter import reducescatter_async


class _Parts:
    """The members' handles, seen as one piece of work (for :meth:`Handle.poll`)."""

    def __init__(self, parts: list[Handle]) -> None:
        self.parts = parts

    def is_completed(self) -> bool:
        return all(part.poll() for part in self.parts)

    def wait(self) -> None:
        """Nothing to do: the group's result waits for each member."""


def _group(kind: str, name: str | None, parts: list[Handle]) -> Handle:
    key = claim(kind, name)
    return Handle(_Parts(parts), lambda: [part.wait() for part in parts], key=key)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> Handle:
    """Start reducing every tensor of ``tensors`` in place.

    The tensors of each dtype and device travel fused: one agreement and one reduction for
    them; the members' dtypes and shapes must agree between the ranks as well.
    """
    members = list(tensors)
    key = claim("grouped_allreduce", name)
    # Every rank's whole group, in the first exchange: a group that differs between the
    # ranks fails there on every rank, so no rank goes on to a second one alone.
    layout = tuple((str(t.dtype), *t.shape) for t in members)
    buckets: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in members:
        buckets.setdefault((t.dtype, t.device), []).append(t)
    fused: list[tuple[Handle, list[torch.Tensor]]] = []
    for index, bucket in enumerate(buckets.values()):
        flat = torch.cat([t.detach().reshape(-1) for t in bucket])
        handle = allreduce_async_(
            flat, average, None, op, prescale_factor, postscale_factor, process_set, layout
        )
        if index < len(buckets) - 1:
            # Whether the ranks' groups agree is known once the first bucket has run; a
            # rank goes on to another bucket only then, so none goes on alone.
            handle.settle()
        if handle.refused:
            return handle
        fused.append((handle, bucket))

    def unpack() -> list[torch.Tensor]:
        for handle, bucket in fused:
            reduced, offset = handle.wait(), 0
            for t in bucket:
                t.copy_(reduced[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
        return members

    return Handle(_Parts([h for h, _ in fused]), unpack, key=key)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """Reduce every tensor of ``tensors`` in place; returns them."""
    return grouped_allreduce_async_(tensors, *args, **kwargs).wait()


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> Handle:
    """Start reducing copies of ``tensors``; ``synchronize(handle)`` returns the list."""
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(
        copies, average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: Any = None
) -> Handle:
    """Start gathering every tensor of ``tensors``; ``synchronize(handle)`` returns the list."""
    claim("grouped_allgather", name)
    parts = [allgather_async(t, None, process_set) for t in tensors]
    return _group("grouped_allgather", name, parts)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start reduce-scattering every tensor of ``tensors``."""
    claim("grouped_reducescatter", name)
    parts = [
        reducescatter_async(t, None, op, process_set, prescale_factor, postscale_factor)
        for t in tensors
    ]
    return _group("grouped_reducescatter", name, parts)


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None = None, op: int = Average, process_set: Any = None
) -> Any:
    """Start reducing a sparse COO tensor by gathering every rank's indices and values, as
    Horovod does; returns a function that waits and gives the reduced sparse tensor (values
    divided by ``size()`` for ``op=hvd.Average``; duplicate indices are left to sum when the
    tensor is coalesced or made dense)."""
    sparse = tensor.coalesce() if not tensor.is_coalesced() else tensor
    label = "sparse" if name is None else name
    indices = allgather_async(
        sparse.indices().transpose(0, 1).contiguous(), f"{label}.indices", process_set
    )
    values = allgather_async(sparse.values(), f"{label}.values", process_set)

    def wait() -> torch.Tensor:
        gathered_values = values.wait()
        gathered_indices = indices.wait()
        if op == Average:
            gathered_values = gathered_values / scope_of(process_set, "sparse_allreduce").size
        return torch.sparse_coo_tensor(
            gathered_indices.transpose(0, 1), gathered_values, tensor.size()
        )

    return wait
