"""Results as they arrive over the channel, in pieces (see :mod:`sparktrain.task.result_upload`), and
the value a run returns from its ranks' records.

The pieces of one task's result must come in order and add up to the size and SHA-256 its
last message announces, and all results together stay within the run's ``max_result_bytes``
(rank 0's alone, or every rank's for ``run_all``); anything else is refused, and the task is
told why (it then keeps the result on its host). The driver holds nothing it has not checked,
and never more than the limit, however many tasks send at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from sparktrain.errors import PayloadError
from sparktrain.rank_outcome import RankOutcome
from sparktrain.shipping.payload import keep_and_say, load_result


class ResultReceiver:
    """Assembles each task's result.

    Args:
        limit: the most bytes all results together may have (``max_result_bytes``).
        all_ranks: every rank sends its value (``run_all``): the limit is on their total.
    """

    def __init__(self, limit: int, all_ranks: bool = False) -> None:
        self.limit = limit
        self.all_ranks = all_ranks
        self._parts: dict[int, bytearray] = {}
        self._broken: dict[int, str] = {}
        self.results: dict[int, bytearray] = {}
        # Bytes in _parts and results together, kept as they change: a chunk's check is O(1)
        # however many tasks send.
        self._held = 0

    def _too_large(self) -> str:
        if self.all_ranks:
            return (
                f"the ranks' results together are larger than max_result_bytes ({self.limit} bytes)"
            )
        return f"it is larger than max_result_bytes ({self.limit} bytes)"

    def chunk(self, message: dict[str, Any]) -> None:
        """One piece (a RESULT_CHUNK message)."""
        index = message["index"]
        if index in self._broken or index in self.results:
            return
        part = self._parts.setdefault(index, bytearray())
        if message["offset"] != len(part):
            self._drop(index, f"a piece at byte {message['offset']} came after {len(part)}")
            return
        data = message["blob"]
        if self._held + len(data) > self.limit:
            # Whatever is sent, and by however many at once, the driver never holds more
            # than the limit: the piece that would pass it is refused, and its task keeps
            # the whole result. The parts of the others may then fit.
            self._drop(index, self._too_large())
            return
        part += data
        self._held += len(data)

    def _drop(self, index: int, why: str) -> None:
        self._broken[index] = why
        self._held -= len(self._parts.pop(index, b""))

    def end(self, message: dict[str, Any]) -> str | None:
        """The last message (RESULT_END); None when the result is whole, else why not."""
        index = message["index"]
        part = self._parts.pop(index, bytearray())
        broken = self._broken.pop(index, None)
        if broken is not None:
            return broken
        if len(part) != message["size"] or hashlib.sha256(part).hexdigest() != message["sha256"]:
            self._held -= len(part)
            if len(part) != message["size"]:
                return f"{len(part)} bytes arrived of {message['size']}"
            return "its SHA-256 does not match what was sent"
        if index in self.results:
            self._held -= len(part)
            return "a result from this task had arrived already"
        self.results[index] = part
        return None

    def attach(self, records: Iterable[RankOutcome]) -> None:
        """Put each received result into the record of the task that sent it."""
        for record in records:
            if record.result_sent is not None and record.result is None:
                record.result = self.results.get(record.index)

    def keep(self, rank_of: Mapping[int, int], name: str) -> str:
        """Keep on this host every result received, and let go of them; what the run's error
        adds about them (empty when none arrived).

        For a run that fails all the same (another rank's result did not fit within the
        limit, or could not be pickled): nothing that came back is lost either.

        Args:
            rank_of: each task index's rank.
            name: the name of rank 0's kept file (see
                :func:`sparktrain.shipping.payload.kept_result_name`); ``rank0`` becomes each rank's.
        """
        base = name.removesuffix("rank0")
        kept = []
        for rank, index in sorted((rank_of.get(i, i), i) for i in self.results):
            data = self.results.pop(index)
            self._held -= len(data)
            kept.append(f"rank {rank}'s: {keep_and_say(data, f'{base}rank{rank}')}")
        if not kept:
            return ""
        return " (of the results that reached the driver, " + "; ".join(kept) + ")"


def rank0_result(records: list[RankOutcome], name: str) -> Any:
    """Rank 0's value; one that does not unpickle here is kept in a file the error names."""
    for record in records:
        if record.rank == 0 and record.ok:
            return _load(record, name)
    raise PayloadError("rank 0's outcome did not reach the driver")


def all_results(
    records: list[RankOutcome], world_size: int, name: str, limit: int | None = None
) -> list[Any]:
    """Every rank's value, as a list by rank (``run_all``).

    Args:
        records: the records of a run whose every rank succeeded.
        world_size: the number of ranks.
        name: the name of rank 0's kept file, for a value that does not unpickle here
            (``rank0`` becomes each rank's ``rank<N>``).
        limit: ``max_result_bytes``. Results that came over the channel were held to it on
            the way; those that came with the Spark job (a detached Connect run, each within
            the limit by itself) are checked here, as a total.

    Raises:
        PayloadError: a rank's outcome or result is missing, naming the ranks; a value does
            not unpickle here; or the values together are over ``limit`` (each is then kept,
            and the error says where).
    """
    by_rank: Mapping[int, RankOutcome] = {r.rank: r for r in records if r.ok}
    missing = [rank for rank in range(world_size) if rank not in by_rank]
    if missing:
        raise PayloadError(f"the outcome of rank(s) {_ranks(missing)} did not reach the driver")
    base = name.removesuffix("rank0")
    total = sum(len(r.result or b"") for r in by_rank.values())
    if limit is not None and total > limit:
        kept = "; ".join(
            f"rank {rank}'s: {keep_and_say(data, f'{base}rank{rank}')}"
            for rank in range(world_size)
            if (data := by_rank[rank].result) is not None
        )
        raise PayloadError(
            f"the ranks' results together ({total} bytes) are larger than max_result_bytes "
            f"({limit} bytes); so that nothing is lost, the driver keeps them: {kept}"
        )
    values = []
    for rank in range(world_size):
        values.append(_load(by_rank[rank], f"{base}rank{rank}"))
        by_rank[rank].result = None  # let go of each pickle once it is loaded
    return values


def _load(record: RankOutcome, name: str) -> Any:
    rank = record.rank
    data = record.result
    if data is None:
        raise PayloadError(f"rank {rank} finished but its result did not reach the driver")
    try:
        return load_result(data)
    except Exception as exc:  # noqa: BLE001 - any unpickling error; re-raised below
        raise PayloadError(
            f"rank {rank}'s result arrived but cannot be loaded on the driver "
            f"({type(exc).__name__}: {exc}); {keep_and_say(data, name)}. A class or module "
            "it needs must be importable on the driver too."
        ) from exc


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:10]))
    return shown + (f" and {len(ranks) - 10} more" if len(ranks) > 10 else "")
