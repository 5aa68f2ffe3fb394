"""``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``."""

from __future__ import annotations

from typing import Any

import torch

from sparktrain.hvdcompat.basics import _checked
from sparktrain.hvdcompat.collectives import _check_root, broadcast_
from sparktrain.hvdcompat.objects import broadcast_object
from sparktrain.hvdcompat.optimizer import _GradientSync


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite the given tensors with ``root_rank``'s, in place.

    Args:
        params: ``model.state_dict()``, or ``(name, tensor)`` pairs such as
            ``model.named_parameters()``, or tensors.
        root_rank: the rank whose values win.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    _check_root(root_rank)
    tensors = [t for _, t in items if isinstance(t, torch.Tensor)]
    with torch.no_grad():
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        for members in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            broadcast_(flat, root_rank)
            offset = 0
            for t in members:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None
) -> None:
    """Make every process's optimizer state and options (``lr``, ...) ``root_rank``'s.

    An optimizer that has not stepped yet first gets its state made by one step on zero
    gradients, as Horovod does, so that there is state to broadcast.

    Raises:
        ValueError: for ``torch.optim.LBFGS``, as in Horovod.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        if isinstance(optimizer, _GradientSync):
            optimizer._local_step()
        else:
            optimizer.step()
    state = optimizer.state_dict()
    if not state["state"]:
        return
    is_root = _checked().rank == root_rank
    sent = _to_cpu(state) if is_root else None
    received = broadcast_object(sent, root_rank)
    if not is_root:
        optimizer.load_state_dict(received)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value
