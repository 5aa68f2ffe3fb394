"""Horovod's object collectives (``broadcast_object``, ``allgather_object``), ``barrier`` and
``join``."""

from __future__ import annotations

import io
from typing import Any

import cloudpickle
import torch

from sparktrain.hvdcompat.basics import _checked, comm_device
from sparktrain.hvdcompat.collectives import (
    _check_root,
    allgather,
    broadcast_,
)
from sparktrain.hvdcompat.matching import blocking, join_round, join_rounds
from sparktrain.hvdcompat.negotiate import Request
from sparktrain.hvdcompat.process_sets import scope_of


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
    scope = scope_of(process_set, "broadcast_object")
    _check_root(root_rank, scope)
    device = comm_device()
    is_root = _checked().rank == root_rank
    payload = _to_bytes(obj).to(device) if is_root else None
    length = torch.tensor([payload.numel() if payload is not None else 0], device=device)
    broadcast_(length, root_rank, name=name, process_set=process_set)
    if payload is None:
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    broadcast_(payload, root_rank, name=name, process_set=process_set)
    return obj if is_root else _from_bytes(payload)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every process's ``obj``, as a list in rank order."""
    scope_of(process_set, "allgather_object")
    payload = _to_bytes(obj).to(comm_device())
    lengths = allgather(torch.tensor([payload.numel()], device=payload.device), name, process_set)
    gathered = allgather(payload, name, process_set)
    out, start = [], 0
    for length in lengths.tolist():
        out.append(_from_bytes(gathered[start : start + length]))
        start += length
    return out


def barrier(process_set: Any = None) -> None:
    """Wait until every process has reached this call.

    An operation this rank started and the others have not yet started does not hold the
    barrier up: it runs once they start it (as in Horovod).

    Raises:
        HorovodInternalError: on every rank, when another rank is in a different collective.
    """
    blocking(Request("barrier"), scope_of(process_set, "barrier").group)


def join(device: int = -1) -> int:
    """Stand in for this rank in the others' allreduces until every rank has joined; returns
    the rank that joined last (the same on every rank).

    As in Horovod, a joined rank contributes zeros to every allreduce the others run (an
    Average still divides by ``size()``); any other collective run while a rank has joined
    raises :class:`HorovodInternalError` on the ranks that called it.

    Args:
        device: the GPU to stand in on, or -1 for the collectives' default device (ignored
            where the ranks have no GPU).
    """
    on_gpu = device >= 0 and "nccl" in _checked().backend and torch.cuda.is_available()
    gpu = torch.device("cuda", device) if on_gpu else None
    rounds = 0
    while True:
        done, rows = join_round(rounds, None, gpu)
        if done:
            spent = join_rounds(rows)
            fewest = min(spent)
            return max(rank for rank, count in enumerate(spent) if count == fewest)
        rounds += 1
