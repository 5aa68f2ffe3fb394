"""Which rows each shard reads in an epoch: pure index math, no I/O.

The dataset is a list of *pieces* (Parquet row groups) with known row counts. For every epoch
all shards compute the same global order: the pieces in a seeded random order, and the rows
of each piece in a seeded random order (identity orders when ``shuffle`` is off). Shard ``i``
takes the contiguous positions ``[i * rows, (i + 1) * rows)`` of that order, where ``rows`` is
the same for every shard, so every shard yields the same number of batches (unequal counts make
DDP and Horovod hang at the last allreduce). The equalization rule:

* ``drop_last=False``: ``rows = ceil(N / shards)``; positions past ``N`` wrap to the start of
  the epoch's order, so the first ``shards * rows - N`` rows (fewer than ``shards``) are read
  twice in that epoch. Each shard yields ``ceil(rows / batch_size)`` batches; the last one may
  be short, and is equally short on every shard.
* ``drop_last=True``: ``rows = (N // (shards * batch_size)) * batch_size``; the last
  ``N - shards * rows`` positions of the epoch's order (fewer than ``shards * batch_size``) are
  not read, and every batch is full. With shuffling the dropped rows change every epoch.

Every other row is read exactly once per epoch across all shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from sparktrain.errors import ConfigurationError

# Stream tags so the seeds of the piece order, the row order in a piece and a shard's local
# mixing window never coincide.
_PIECE_ORDER = 0
_ROW_ORDER = 1
_WINDOW_ORDER = 2


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of rows of one piece, as positions in that piece's order for the epoch.

    Attributes:
        piece: index of the piece (row group) in the dataset's piece list.
        start: first position (inclusive) in :func:`row_order_in_piece` of that piece.
        stop: last position (exclusive).
    """

    piece: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """Number of rows in the segment."""
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """What one shard reads in one epoch.

    Attributes:
        rows: rows the shard yields (the same on every shard).
        batches: batches the shard yields (the same on every shard).
        segments: the runs of rows to read, in order.
        padded: rows that the whole epoch reads twice to equalize the shards.
        dropped: rows that the whole epoch leaves out to equalize the shards.
    """

    rows: int
    batches: int
    segments: tuple[Segment, ...]
    padded: int
    dropped: int


def shard_size(
    total_rows: int, shard_count: int, batch_size: int, drop_last: bool
) -> tuple[int, int]:
    """Rows and batches every shard yields per epoch.

    Args:
        total_rows: rows in the dataset.
        shard_count: number of shards (ranks).
        batch_size: rows per batch.
        drop_last: drop rows so every batch is full, instead of padding shards to equal size.

    Returns:
        ``(rows, batches)`` per shard.

    Raises:
        ConfigurationError: the dataset is empty, or too small for one full batch per shard
            with ``drop_last=True``.
    """
    if total_rows <= 0:
        raise ConfigurationError(
            "the dataset has no rows; convert a DataFrame with at least one row"
        )
    if drop_last:
        batches = total_rows // (shard_count * batch_size)
        if batches == 0:
            raise ConfigurationError(
                f"drop_last=True leaves no batch: {total_rows} row(s) cannot fill one batch of "
                f"{batch_size} on each of {shard_count} shard(s); lower batch_size or set "
                f"drop_last=False"
            )
        return batches * batch_size, batches
    rows = -(-total_rows // shard_count)
    return rows, -(-rows // batch_size)


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def piece_visit_order(num_pieces: int, *, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The order in which the epoch visits the pieces (identical on every shard)."""
    if not shuffle:
        return np.arange(num_pieces)
    return _rng(seed, epoch, _PIECE_ORDER).permutation(num_pieces)


def row_order_in_piece(
    num_rows: int, *, piece: int, epoch: int, seed: int, shuffle: bool
) -> np.ndarray | None:
    """Row indices of one piece in the epoch's order; ``None`` means the natural order."""
    if not shuffle:
        return None
    return _rng(seed, epoch, _ROW_ORDER, piece).permutation(num_rows)


def window_order(num_rows: int, *, window: int, shard: int, epoch: int, seed: int) -> np.ndarray:
    """A shard-local permutation mixing the rows of a few consecutive segments."""
    return _rng(seed, epoch, _WINDOW_ORDER, shard, window).permutation(num_rows)


def plan_shard(
    piece_rows: Sequence[int],
    *,
    shard_count: int,
    cur_shard: int,
    batch_size: int,
    drop_last: bool = False,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
) -> ShardPlan:
    """The segments that shard ``cur_shard`` reads in ``epoch`` (see the module docstring).

    Args:
        piece_rows: row count of every piece, in dataset order.
        shard_count: number of shards.
        cur_shard: this shard, ``0 <= cur_shard < shard_count``.
        batch_size: rows per batch.
        drop_last: drop rows instead of padding (see the module docstring).
        epoch: epoch number; with ``shuffle`` each epoch has its own order.
        seed: seed of the orders; must be the same on every shard.
        shuffle: shuffle piece and row orders.

    Returns:
        The shard's plan for the epoch.

    Raises:
        ConfigurationError: invalid shard numbers, or see :func:`shard_size`.
    """
    validate_shard(cur_shard, shard_count)
    total = int(sum(piece_rows))
    rows, batches = shard_size(total, shard_count, batch_size, drop_last)
    order = piece_visit_order(len(piece_rows), epoch=epoch, seed=seed, shuffle=shuffle)
    starts = np.concatenate(([0], np.cumsum([piece_rows[p] for p in order])))

    segments: list[Segment] = []
    position, end = cur_shard * rows, (cur_shard + 1) * rows
    while position < end:
        # Positions past the end wrap to the start of the order (padding).
        offset = position % total
        run = min(end - position, total - offset)
        first = int(np.searchsorted(starts, offset, side="right")) - 1
        remaining = run
        k = first
        while remaining > 0:
            piece = int(order[k])
            lo = offset - int(starts[k]) if k == first else 0
            hi = min(int(piece_rows[piece]), lo + remaining)
            if hi > lo:
                segments.append(Segment(piece, lo, hi))
                remaining -= hi - lo
            k += 1
        position += run
    padded = shard_count * rows - total if not drop_last else 0
    dropped = total - shard_count * rows if drop_last else 0
    return ShardPlan(rows, batches, tuple(segments), padded, dropped)


def validate_shard(cur_shard: int, shard_count: int) -> None:
    """Raise a :class:`ConfigurationError` unless ``0 <= cur_shard < shard_count``."""
    valid = (
        not isinstance(shard_count, bool)
        and isinstance(shard_count, int)
        and not isinstance(cur_shard, bool)
        and isinstance(cur_shard, int)
        and 0 <= cur_shard < shard_count
    )
    if not valid:
        raise ConfigurationError(
            f"cur_shard and shard_count must be ints with 0 <= cur_shard < shard_count; got "
            f"cur_shard={cur_shard!r}, shard_count={shard_count!r} (leave both unset to use "
            f"the run's rank and world size)"
        )
