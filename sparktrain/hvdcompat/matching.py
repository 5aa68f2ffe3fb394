"""Matching the ranks' operations: which one runs next on a process group, decided in rounds.

Horovod matches operations across ranks by name in a background loop, so a rank may start an
async operation while another rank is still in ``barrier()``, and the operation runs once every
rank has started it. Here the same happens without a background thread: every call that
communicates (starting an operation, ``synchronize``, ``poll``, ``barrier``, ``join``) takes
part in a *round*, one small all-gather on the group of what each rank offers:

* its *next* operation: the oldest one it started that has not run yet (pending), or else the
  call it is in;
* the call it is *in*, if it blocks there: ``barrier``, ``join``, or waiting for one of its
  operations (``synchronize``).

Every rank reads the same rows and decides the same thing (see :func:`decide`): the next
operations run if they fit together; else the calls the ranks are in, if every rank is in one
and they fit (a ``barrier`` passes while one rank's operation waits for the others); else, when
every rank is blocked and nothing fits, the blocked calls fail on every rank with what differs
(:class:`HorovodInternalError`), and when every rank offers an operation it already started and
they do not fit, those fail. Otherwise nothing runs: a rank that was only starting an operation
goes on (its operation stays pending), and a rank blocked in a call takes part in the next
round. At most one operation runs per round, so the data of the operations moves in the same
order on every rank.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sparktrain.hvdcompat import timeline
from sparktrain.hvdcompat.basics import comm_device
from sparktrain.hvdcompat.dtypes import for_reduction
from sparktrain.hvdcompat.exceptions import HorovodInternalError
from sparktrain.hvdcompat.handles import Handle
from sparktrain.hvdcompat.negotiate import (
    HEADER,
    SLOTS,
    Request,
    check,
    device_type_of,
    dtype_of,
    encode,
    kind_of,
    numel_of,
)

# What a row's slot says a rank offers.
_NONE, _PENDING, _CURRENT, _WAIT = 0, 1, 2, 3
Rows = list[list[int]]


@dataclasses.dataclass(frozen=True)
class Agreement:
    """The rows of the round in which an operation runs.

    Attributes:
        first_dims: each rank's first dimension of the operation's tensor, in group order.
        joined: the ranks (in group order) that stand in for this allreduce (``hvd.join``).
    """

    first_dims: list[int]
    joined: tuple[int, ...] = ()


# Launches an operation's data once the ranks agree: returns (work, finish) for its handle.
Start = Callable[[Agreement], tuple[Any, Callable[[], Any]]]


@dataclasses.dataclass(eq=False)
class Op:
    """An operation a rank started, waiting for the others.

    Attributes:
        request: what it is (travels in the rounds).
        start: launches its data.
        handle: the handle the caller holds.
        refuse: turns a disagreement into what this rank raises for it.
    """

    request: Request
    start: Start
    handle: Handle
    refuse: Callable[[HorovodInternalError], BaseException] = lambda exc: exc


@dataclasses.dataclass
class _Lane:
    """A process group's operations not yet run on this rank, oldest first."""

    group: Any
    pending: list[Op] = dataclasses.field(default_factory=list)


_lanes: dict[int, _Lane] = {}


def _lane(group: Any) -> _Lane:
    lane = _lanes.get(id(group))
    if lane is None or lane.group is not group:
        lane = _lanes[id(group)] = _Lane(group)
    return lane


def forget_lanes() -> None:
    """Drop every pending operation (on shutdown: they can no longer run)."""
    _lanes.clear()


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a round decided, the same on every rank.

    Attributes:
        action: ``"run_next"``, ``"run_in"`` (the calls the ranks are in), ``"fail_in"``,
            ``"fail_next"``, ``"all_joined"`` or ``"none"``.
        error: for the failures: the disagreement, as seen from the rank that decided.
        joined: the ranks in ``hvd.join``.
    """

    action: str
    error: HorovodInternalError | None = None
    joined: tuple[int, ...] = ()


def _next(row: list[int]) -> list[int]:
    return row[:SLOTS]


def _in(row: list[int]) -> list[int]:
    return row[SLOTS : 2 * SLOTS]


def _flags(row: list[int]) -> tuple[int, int]:
    return row[2 * SLOTS], row[2 * SLOTS + 1]


def _fits(described: list[tuple[int, list[int]]], mine: Request) -> HorovodInternalError | None:
    try:
        check(described, mine)
    except HorovodInternalError as exc:
        return exc
    return None


def decide(rows: Rows, my_next: Request, my_in: Request | None, me: int) -> Decision:
    """What runs after a round whose rows (in group order) are ``rows``.

    Args:
        rows: every rank's offer.
        my_next: this rank's next operation (for the wording of an error).
        my_in: the call this rank is in, if any (likewise).
        me: this rank's place in the group.
    """
    joined = tuple(
        rank
        for rank, row in enumerate(rows)
        if _flags(row)[1] == _CURRENT and kind_of(_in(row)) == "join"
    )
    if joined:
        if len(joined) == len(rows):
            return Decision("all_joined", joined=joined)
        active = [(rank, _next(row)) for rank, row in enumerate(rows) if rank not in joined]
        kind = kind_of(active[0][1])
        if me in joined:
            mine = Request(kind or "allreduce")
        else:
            mine = my_next
        error = _fits(active, mine)
        if error is None and kind != "allreduce":
            names = ", ".join(map(str, joined))
            error = HorovodInternalError(
                f"hvd.{kind} cannot run while rank(s) {names} have joined (hvd.join): joined "
                f"ranks stand in only for allreduce; call hvd.{kind} before hvd.join() on "
                "every rank"
            )
        if error is None:
            return Decision("run_next", joined=joined)
        if all(_flags(rows[rank])[1] != _NONE for rank, _ in active):
            return Decision("fail_next", error, joined)
        return Decision("none", joined=joined)
    error = _fits([(rank, _next(row)) for rank, row in enumerate(rows)], my_next)
    if error is None:
        return Decision("run_next")
    if all(_flags(row)[1] != _NONE for row in rows):
        assert my_in is not None  # this rank is in a call too
        in_error = _fits([(rank, _in(row)) for rank, row in enumerate(rows)], my_in)
        if in_error is None:
            return Decision("run_in")
        return Decision("fail_in", in_error)
    if all(_flags(row)[0] == _PENDING for row in rows):
        return Decision("fail_next", error)
    return Decision("none")


@dataclasses.dataclass
class _Call:
    """The call this rank is in during a round: a barrier/join request, or an op waited for."""

    request: Request | None = None
    waiting: Op | None = None
    device: torch.device | None = None  # a joined rank's GPU, if it names one
    done: bool = False
    rows: Rows = dataclasses.field(default_factory=list)
    error: BaseException | None = None


def _round(lane: _Lane, call: _Call) -> Decision:
    """Take part in one round on ``lane``'s group; runs what it decides on this rank."""
    group = lane.group
    head = lane.pending[0] if lane.pending else None
    in_request = call.waiting.request if call.waiting is not None else call.request
    if call.request is not None and call.request.kind == "join":
        head = None  # a joined rank offers only its join
    next_request = head.request if head is not None else in_request
    assert next_request is not None  # a round needs something to offer
    in_flag = _NONE if in_request is None else (_WAIT if call.waiting is not None else _CURRENT)
    row = [
        *encode(next_request),
        *(encode(in_request) if in_request is not None else [0] * SLOTS),
        _PENDING if head is not None else _CURRENT,
        in_flag,
    ]
    began = time.monotonic_ns()
    mine = torch.tensor(row, dtype=torch.int64, device=comm_device())
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    rows = [r.tolist() for r in torch.stack(gathered).cpu()]
    me = dist.get_rank(group)
    decision = decide(rows, next_request, in_request, me)
    joined = decision.joined
    if decision.action == "run_next":
        if me in joined:
            _stand_in(rows, joined, group, call.device)
        elif head is not None:
            _run(lane, head, rows, began, joined, lambda r: _next(r))
        else:
            call.done, call.rows = True, rows
    elif decision.action == "run_in":
        if call.waiting is not None:
            _run(lane, call.waiting, rows, began, (), lambda r: _in(r))
        else:
            call.done, call.rows = True, rows
    elif decision.action == "fail_in":
        assert decision.error is not None
        if call.waiting is not None:
            _fail(lane, call.waiting, decision.error)
        else:
            call.done, call.error = True, decision.error
    elif decision.action == "fail_next" and me not in joined:
        assert decision.error is not None
        if head is not None:
            _fail(lane, head, decision.error)
        else:
            call.done, call.error = True, decision.error
    elif decision.action == "all_joined":
        call.done, call.rows = True, rows
    return decision


def _run(
    lane: _Lane,
    op: Op,
    rows: Rows,
    began: int,
    joined: tuple[int, ...],
    part: Callable[[list[int]], list[int]],
) -> None:
    lane.pending.remove(op)
    timeline.agreed(op.request.kind, op.request.name, began, time.monotonic_ns())
    agreement = Agreement([part(row)[HEADER] for row in rows], joined)
    try:
        work, finish = op.start(agreement)
    except HorovodInternalError as exc:
        op.handle.refuse(op.refuse(exc))
        return
    op.handle.begin(work, finish)


def _fail(lane: _Lane, op: Op, error: HorovodInternalError) -> None:
    lane.pending.remove(op)
    op.handle.refuse(op.refuse(error))


def _stand_in(rows: Rows, joined: tuple[int, ...], group: Any, gpu: torch.device | None) -> None:
    """A joined rank's zeros in the others' allreduce, on the device their tensors are on."""
    active = next(_next(row) for rank, row in enumerate(rows) if rank not in joined)
    dtype, numel, op = stand_in_of(active)
    where = torch.device("cpu")
    if device_type_of(active) == "cuda":
        where = gpu or torch.device("cuda", torch.cuda.current_device())
    buffer = for_reduction(torch.zeros(numel, dtype=dtype, device=where))
    dist.all_reduce(buffer, op=_reduce_op(op), group=group)


def stand_in_of(described: list[int]) -> tuple[torch.dtype, int, int]:
    """The dtype, number of elements and op of an allreduce's description."""
    return dtype_of(described), numel_of(described), described[4]


def _reduce_op(op: int) -> Any:
    return {
        0: dist.ReduceOp.SUM,
        1: dist.ReduceOp.SUM,
        3: dist.ReduceOp.MIN,
        4: dist.ReduceOp.MAX,
        5: dist.ReduceOp.PRODUCT,
    }[op]


def submit(
    request: Request,
    group: Any,
    start: Start,
    key: tuple[str, str] | None,
    refuse: Callable[[HorovodInternalError], BaseException] | None = None,
) -> Handle:
    """Start an operation: it joins this rank's pending ones on ``group`` and takes part in
    one round (where every rank started it in step, it runs there).

    Returns:
        Its handle; ``synchronize`` waits (in rounds) until it has run.
    """
    lane = _lane(group)
    handle = Handle.pending(key)
    op = Op(request, start, handle, refuse or (lambda exc: exc))
    handle.settle_with(lambda: _settle(lane, op), lambda: _nudge(lane, op))
    lane.pending.append(op)
    _round(lane, _Call())
    return handle


def _settle(lane: _Lane, op: Op) -> None:
    """Rounds until ``op`` has run or failed (this rank waits for it)."""
    call = _Call(waiting=op)
    while op in lane.pending:
        _round(lane, call)


def _nudge(lane: _Lane, op: Op) -> None:
    """One round, for ``poll`` on an operation still pending."""
    if op in lane.pending:
        _round(lane, _Call())


def blocking(request: Request, group: Any) -> Rows:
    """Take part in rounds until the call ``request`` (``barrier``, ``join``) passes; returns
    the rows of the round that let it pass.

    Raises:
        HorovodInternalError: when the ranks are blocked in calls that do not fit together.
    """
    lane = _lane(group)
    call = _Call(request=request)
    while not call.done:
        _round(lane, call)
    if call.error is not None:
        raise call.error
    return call.rows


def join_rounds(rows: Rows) -> list[int]:
    """From the rows of the round where every rank had joined: how many rounds each spent."""
    return [_in(row)[5] for row in rows]


def join_round(rounds: int, group: Any, gpu: torch.device | None) -> tuple[bool, Rows]:
    """One round of ``hvd.join``: whether every rank has joined (and the rows).

    Args:
        rounds: how many rounds this rank has spent in join so far.
        group: the process group.
        gpu: where to stand in for allreduces of CUDA tensors (None: the current GPU).
    """
    lane = _lane(group)
    call = _Call(request=Request("join", root=rounds), device=gpu)
    decision = _round(lane, call)
    return decision.action == "all_joined", call.rows
