"""What travels for a tensor of each dtype, and Horovod's scaling arithmetic.

torch's Gloo has no int16 or uint16, and sums bool tensors bytewise (``True + True`` leaves a
2 in a bool's byte). So for reductions those dtypes travel widened to int32 and are cast back
after, which gives exactly the values of their own arithmetic (sums and products wrap modulo
2**16 either way; a bool sum is a logical or, as in Horovod); for collectives that only move
data (broadcast, allgather, alltoall), int16 and uint16 travel as float16 bits, unchanged.

Scaling is Horovod's (its CPU ``ScaleBuffer``): floating-point tensors are multiplied in their
own precision (float16 through float32), integer tensors in float64 and the product converted
back to the integer type, which truncates toward zero (``-36.5`` gives ``-36``, not ``-37``).
"""

from __future__ import annotations

import torch

from sparktrain.hvdcompat.exceptions import HorovodInternalError

# Reduced as int32, then cast back.
_WIDEN = frozenset({torch.int16, torch.uint16, torch.bool})
# Moved as float16 bits.
_REINTERPRET = frozenset({torch.int16, torch.uint16})


def for_reduction(tensor: torch.Tensor) -> torch.Tensor:
    """The buffer to reduce: ``tensor`` itself, or a widened copy to copy back after."""
    return tensor.to(torch.int32) if tensor.dtype in _WIDEN else tensor


def for_moving(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a view of its bits in a dtype Gloo moves (same storage)."""
    return tensor.view(torch.float16) if tensor.dtype in _REINTERPRET else tensor


def restore(moved: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A moved buffer seen as ``dtype`` again (the inverse of :func:`for_moving`)."""
    return moved.view(dtype) if moved.dtype != dtype else moved


def check_scalable(dtype: torch.dtype, *factors: float) -> None:
    """Refuse to scale a bool tensor (there is no meaningful product).

    Raises:
        HorovodInternalError: for a bool tensor and a factor other than 1.
    """
    if dtype == torch.bool and any(f != 1.0 for f in factors):
        raise HorovodInternalError(
            "bool tensors cannot be averaged or scaled: use op=hvd.Sum (a logical or), "
            "hvd.Min or hvd.Max, without prescale_factor/postscale_factor"
        )


def scale(tensor: torch.Tensor, factor: float) -> None:
    """Multiply ``tensor`` by ``factor`` in place, as Horovod does (see the module's text)."""
    if factor == 1.0:
        return
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.mul_(factor)
    else:
        # float64 product, converted back: the conversion truncates toward zero, as C++'s.
        tensor.copy_(tensor.double().mul_(factor).to(tensor.dtype))
