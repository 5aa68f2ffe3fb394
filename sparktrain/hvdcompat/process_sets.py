"""Horovod's process sets (``hvd.ProcessSet``, ``add_process_set``, ...) on torch.distributed.

A process set is a subset of the ranks that run collectives among themselves: each one is a
torch.distributed group, made by ``dist.new_group`` when the set is registered. torch needs
every rank of the job to take part in making a group, in the same order; Horovod asks the same
of ``hvd.init(process_sets=...)``, ``hvd.add_process_set`` and ``hvd.remove_process_set``
(every rank calls them, members or not), so the sets get the same ids on every rank.

As in Horovod, a collective on a set counts ranks within the set (``op=Average`` divides by the
set's size, ``allgather`` concatenates in the set's rank order), but roots are global ranks
(``hvd.broadcast(t, root_rank=hvd.rank() of the root, process_set=s)``); a rank that is not a
member of the set it passes gets a ``ValueError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch.distributed as dist

from sparktrain.hvdcompat.basics import _checked


class ProcessSet:
    """A set of ranks that run collectives together (``hvd.ProcessSet``).

    Example:
        >>> evens = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 0])  # doctest: +SKIP
        >>> if evens.included():  # doctest: +SKIP
        ...     hvd.allreduce(t, process_set=evens)

    Args:
        ranks: the global ranks in the set (kept sorted).

    Raises:
        ValueError: for anything but a list of integer ranks (an MPI communicator: there is no
            MPI here).
    """

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks: Iterable[int]) -> None:
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
            raise ValueError(
                "ProcessSet takes a list of ranks (mpi4py communicators need MPI, which "
                "sparktrain's built-in horovod.torch does not use)"
            )
        values = sorted(ranks)
        if any(isinstance(r, bool) or not isinstance(r, int) for r in values):
            raise ValueError(f"ProcessSet takes a list of integer ranks, not {values!r}")
        self.ranks = values

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> int | None:
        """The number of ranks in the set, or None while it is not registered."""
        if self.process_set_id is None:
            return None
        return len(_scope(self).ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (its place in ``ranks``), or None while the set
        is not registered. Collectives' ``root_rank`` is still the global rank."""
        if self.process_set_id is None:
            return None
        return _scope(self).rank

    def included(self) -> bool | None:
        """Whether this process is in the set (None for a set made without ranks)."""
        if self.ranks is None:
            return None
        return _checked().rank in self.ranks

    def __str__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
            f"mpi_comm={self.mpi_comm})"
        )

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


@dataclasses.dataclass(frozen=True)
class Scope:
    """Where a collective runs: the torch group (None: every rank), its global ranks, and
    this process's rank within it."""

    group: Any
    ranks: tuple[int, ...]
    rank: int

    @property
    def size(self) -> int:
        """The number of ranks in the scope."""
        return len(self.ranks)


@dataclasses.dataclass
class _Registry:
    """The sets registered since init(), by id (0, the global set, is never in it)."""

    sets: dict[int, tuple[tuple[int, ...], Any]] = dataclasses.field(default_factory=dict)
    objects: list[ProcessSet] = dataclasses.field(default_factory=list)
    next_id: int = 1


_registry = _Registry()


def _scope(process_set: Any) -> Scope:
    state = _checked()
    if process_set is None or process_set is global_process_set:
        return Scope(None, tuple(range(state.size)), state.rank)
    set_id = getattr(process_set, "process_set_id", None)
    if set_id == 0:
        return Scope(None, tuple(range(state.size)), state.rank)
    if set_id is None or set_id not in _registry.sets:
        raise ValueError(
            f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
            "hvd.add_process_set() on every rank first"
        )
    ranks, group = _registry.sets[set_id]
    rank = ranks.index(state.rank) if state.rank in ranks else -1
    return Scope(group, ranks, rank)


def scope_of(process_set: Any, function: str) -> Scope:
    """Where ``hvd.<function>(process_set=process_set)`` runs, for a member of the set.

    Raises:
        ValueError: when the set is not registered, or this rank is not a member.
    """
    scope = _scope(process_set)
    if scope.rank < 0:
        raise ValueError(
            f"hvd.{function}: rank {_checked().rank} is not a member of the provided process "
            f"set {list(scope.ranks)}; call it only on the set's ranks (process_set.included())"
        )
    return scope


def _register(process_set: ProcessSet) -> ProcessSet:
    state = _checked()
    ranks = tuple(process_set.ranks or ())
    if not ranks:
        raise ValueError("a process set needs at least one rank")
    if len(set(ranks)) != len(ranks) or not all(0 <= r < state.size for r in ranks):
        raise ValueError(
            f"a process set's ranks must be distinct ranks of this job (0..{state.size - 1}), "
            f"not {list(ranks)}"
        )
    known = {r for r, _ in _registry.sets.values()} | {tuple(range(state.size))}
    if ranks in known:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    # Every rank makes the group, members or not: torch's new_group is collective.
    group = dist.new_group(list(ranks))
    set_id = _registry.next_id
    _registry.next_id += 1
    _registry.sets[set_id] = (ranks, group)
    _registry.objects.append(process_set)
    process_set.process_set_id = set_id
    return process_set


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set after init() and return it (``hvd.add_process_set``).

    Every rank must call it, with the same ranks, in the same order as the other sets.

    Raises:
        ValueError: for a set of the same ranks as one registered (the global set included),
            or ranks that are not ranks of the job.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    return _register(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set added before; whether it was registered (``hvd.remove_process_set``).

    Every rank must call it. The global set is never removed (False).
    """
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    process_set._invalidate()
    entry = _registry.sets.pop(set_id, None)
    if entry is None:
        return False
    _, group = entry
    if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(group)
    _registry.objects = [ps for ps in _registry.objects if ps is not process_set]
    return True


def init_process_sets(process_sets: Any) -> None:
    """Register the sets given to ``hvd.init(process_sets=...)``, in order.

    Args:
        process_sets: None, ``"dynamic"`` (none now, add later), or a list of ProcessSets.

    Raises:
        ValueError: naming the entry that repeats another set (nothing is registered then
            beyond the entries before it).
    """
    global_process_set.ranks = list(range(_checked().size))
    if process_sets is None or (isinstance(process_sets, str) and process_sets == "dynamic"):
        return
    for index, process_set in enumerate(list(process_sets)):
        if not isinstance(process_set, ProcessSet):
            raise ValueError(
                f"hvd.init(process_sets=...) entry number {index} is {process_set!r}, not an "
                "hvd.ProcessSet"
            )
        try:
            _register(process_set)
        except ValueError as exc:
            raise ValueError(
                f"Horovod could not be initialized because process_sets entry number {index} "
                f"is a duplicate or invalid: {exc}"
            ) from None


def forget_process_sets() -> None:
    """Unregister every set (on shutdown: the groups end with the job's process group)."""
    for process_set in _registry.objects:
        process_set._invalidate()
    _registry.sets.clear()
    _registry.objects.clear()
    _registry.next_id = 1
