"""How the ranks describe a collective to each other, and when descriptions fit together.

Each rank describes the collective it is about to run (which one, its name, the tensor's dtype,
device and shape, the reduction op, the root, the scale factors) in a small fixed vector of
integers; :mod:`sparktrain.hvdcompat.matching` gathers them in its rounds, and every rank
checks them the same way. So inputs that do not fit together (an int32 tensor against a
float32 one, shapes that differ, two roots, one rank in ``allreduce`` while another is in
``barrier``) raise :class:`HorovodInternalError` on every rank, with the same message, instead
of moving garbage or hanging, and the process group stays in step for what follows. For
``allgather`` the same description carries each rank's first dimension, which the gather needs.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Any

import torch

from sparktrain.hvdcompat.exceptions import HorovodInternalError

# Dtypes by code; 0 means "no tensor" (barrier, join).
_DTYPES: tuple[torch.dtype, ...] = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES, start=1)}
_DEVICES = ("none", "cpu", "cuda")
# Dimensions carried one by one; a tensor with more has the rest folded into the last slot.
MAX_DIMS = 8
HEADER = 9  # kind, name, dtype, device, op, root, prescale, postscale, ndim
_NUMEL = HEADER + MAX_DIMS  # then the dimensions, then the number of elements,
_LAYOUT = _NUMEL + 1  # then a hash of the shapes of a group fused into one tensor
SLOTS = _LAYOUT + 1


@dataclasses.dataclass(frozen=True)
class Request:
    """What one rank is about to run.

    Attributes:
        kind: the collective, as its ``hvd`` function is named (``"allreduce"``, ...).
        name: the ``name=`` given, if any.
        tensor: the input, if the collective has one.
        op: the reduction op, for reductions.
        root: the root rank, for broadcasts.
        prescale: the prescale factor, for reductions.
        postscale: the postscale factor, for reductions.
        layout: the dtypes and shapes of a group's tensors, when ``tensor`` carries the group.
    """

    kind: str
    name: str | None = None
    tensor: torch.Tensor | None = None
    op: int = -1
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    layout: tuple[tuple[Any, ...], ...] = ()


_KINDS = (
    "allreduce",
    "allgather",
    "broadcast",
    "barrier",
    "join",
    "alltoall",
    "reducescatter",
    "grouped_allreduce",
    "grouped_allgather",
    "grouped_reducescatter",
)
_KIND_CODE = {kind: code for code, kind in enumerate(_KINDS, start=1)}


def _float_bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", float(value)))[0])


def _name_code(name: str | None) -> int:
    return 0 if name is None else zlib.crc32(name.encode()) + 1


def _shape_slots(shape: tuple[int, ...]) -> list[int]:
    if len(shape) <= MAX_DIMS:
        return list(shape) + [0] * (MAX_DIMS - len(shape))
    tail = zlib.crc32(repr(shape[MAX_DIMS - 1 :]).encode())
    return list(shape[: MAX_DIMS - 1]) + [tail]


def encode(request: Request) -> list[int]:
    """The request as the fixed vector of integers that travels."""
    tensor = request.tensor
    shape = tuple(tensor.shape) if tensor is not None else ()
    return [
        _KIND_CODE[request.kind],
        _name_code(request.name),
        _DTYPE_CODE.get(tensor.dtype, 99) if tensor is not None else 0,
        _DEVICES.index(tensor.device.type) if tensor is not None else 0,
        request.op,
        request.root,
        _float_bits(request.prescale),
        _float_bits(request.postscale),
        len(shape),
        *_shape_slots(shape),
        tensor.numel() if tensor is not None else 0,
        zlib.crc32(repr(request.layout).encode()) if request.layout else 0,
    ]


_OPS = ("Average", "Sum", "Adasum", "Min", "Max", "Product")


def _describe(row: list[int], what: int) -> str:
    if what == 4 and row[0] == _KIND_CODE["alltoall"]:
        return str(row[4])
    if what == 4:
        return f"hvd.{_OPS[row[4]]}" if 0 <= row[4] < len(_OPS) else str(row[4])
    if what == 0:
        return f"hvd.{_KINDS[row[0] - 1]}"
    if what == 2:
        return str(_DTYPES[row[2] - 1]).replace("torch.", "") if 0 < row[2] <= len(_DTYPES) else "?"
    if what == 3:
        return _DEVICES[row[3]]
    if what == 8:
        return str(row[HEADER : HEADER + min(row[8], MAX_DIMS)])
    if what in (6, 7):
        return repr(struct.unpack("<d", struct.pack("<q", row[what]))[0])
    return str(row[what])


Rows = list[tuple[int, list[int]]]  # (rank, its description)


def _mismatch(rows: Rows, slot: int) -> tuple[int, int] | None:
    """The first rank whose value of ``slot`` differs from the first row's, with that one."""
    first, values = rows[0]
    for rank, row in rows:
        if row[slot] != values[slot]:
            return first, rank
    return None


def _fail(rows: Rows, request: Request, what: str, slot: int, pair: tuple[int, int]) -> None:
    by_rank = dict(rows)
    a, b = pair
    if slot in (1, _LAYOUT):  # only hashes travel: say who differs
        detail = f"rank {a} and rank {b} differ"
    else:
        detail = f"rank {a} {_describe(by_rank[a], slot)}, rank {b} {_describe(by_rank[b], slot)}"
    label = f"hvd.{request.kind}" + (f" (name={request.name!r} here)" if request.name else "")
    raise HorovodInternalError(
        f"{label}: the ranks passed {what}: {detail}. Every rank must pass the same; nothing "
        "was sent, and the ranks can go on with further collectives"
    )


def check(rows: Rows, request: Request) -> None:
    """Raise unless the descriptions ``rows`` fit together (``request`` is this rank's).

    Raises:
        HorovodInternalError: naming the first difference found.
    """
    pair = _mismatch(rows, 0)
    if pair is not None:
        by_rank = dict(rows)
        a, b = pair
        raise HorovodInternalError(
            f"the ranks called different collectives at the same point: rank {a} "
            f"{_describe(by_rank[a], 0)}, rank {b} {_describe(by_rank[b], 0)}. Every rank must "
            "call the same collectives in the same order; nothing was sent"
        )
    ops = "different reduction ops (op=)"
    if request.kind == "alltoall":  # the op slot says whether the rank refused its splits
        ops = "splits that one rank refused (1: refused; see its error)"
    checks = [
        (1, "different names (name=)"),
        (2, "tensors of different data types"),
        (3, "tensors on different devices"),
        (4, ops),
        (5, "different root ranks (root_rank=)"),
        (6, "different prescale factors (prescale_factor=)"),
        (7, "different postscale factors (postscale_factor=)"),
        (_LAYOUT, "groups of tensors of different dtypes or shapes"),
    ]
    for slot, what in checks:
        pair = _mismatch(rows, slot)
        if pair is not None:
            _fail(rows, request, what, slot, pair)
    if request.kind in ("allgather", "grouped_allgather", "alltoall"):
        # The first dimension may differ; the others must not.
        shape_slots = [8, *range(HEADER + 1, _NUMEL)]
        what = "tensors whose shapes differ beyond the first dimension"
    else:
        shape_slots = list(range(8, _NUMEL))
        what = "tensors of different shapes"
    for slot in shape_slots:
        pair = _mismatch(rows, slot)
        if pair is not None:
            _fail(rows, request, what, 8, pair)


def kind_of(described: list[int]) -> str:
    """The collective a description is of (``""`` for none)."""
    code = described[0]
    return _KINDS[code - 1] if 0 < code <= len(_KINDS) else ""


def dtype_of(described: list[int]) -> torch.dtype:
    """The dtype of a description's tensor."""
    return _DTYPES[described[2] - 1]


def numel_of(described: list[int]) -> int:
    """The number of elements of a description's tensor."""
    return described[_NUMEL]


def device_type_of(described: list[int]) -> str:
    """The device type (``"cpu"``, ``"cuda"``) of a description's tensor."""
    return _DEVICES[described[3]]
