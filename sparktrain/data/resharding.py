"""Where an interrupted epoch goes on, at the same or another number of shards: pure math.

An epoch's rows have positions ``0 .. N-1`` in the epoch's global order (see
:mod:`sparktrain.data.sharding`: pieces in a seeded order, rows in a piece in a seeded order).
An epoch runs in *stages*: the first stage splits all positions among its shards; when a run
restarts mid-epoch, the next stage splits the positions that no shard of the earlier stages
read (the *stream*, kept in the global order) among the new number of shards, by the same
rule (contiguous equal shares, padded by wrapping to the stream's start, or cut for
``drop_last``). Within a shard, rows are served window by window (``shuffle_window``
segments, mixed with a seeded order); so what a shard has read after ``r`` rows is a pure
function of the stage, the shard and ``r``. A stage is therefore described by its shard count
and the rows each shard has served, and an epoch's progress by its list of stages: a few
integers per shard, never a list of rows.

Sets of positions are kept as sorted, disjoint half-open spans (two int64 arrays).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from sparktrain.data.sharding import Segment, piece_visit_order, shard_size, window_order

Spans = tuple[np.ndarray, np.ndarray]
# A finished stage: (shard count, rows each shard served).
Stage = tuple[int, tuple[int, ...]]


def pieces_digest(piece_rows: Sequence[int]) -> str:
    """A short digest of the pieces' row counts: a saved place fits only the same pieces."""
    text = ",".join(str(int(rows)) for rows in piece_rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def spans_of(starts: Sequence[int], stops: Sequence[int]) -> Spans:
    """Spans from their bounds."""
    return np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)


def span_rows(spans: Spans) -> int:
    """Number of positions in ``spans``."""
    return int((spans[1] - spans[0]).sum())


def positions(spans: Spans) -> np.ndarray:
    """Every position of ``spans``, in order (for tests and small sets)."""
    if not len(spans[0]):
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b) for a, b in zip(*spans, strict=True)])


def spans_from_positions(values: np.ndarray) -> Spans:
    """Sorted, merged spans covering exactly the (distinct) ``values``."""
    values = np.sort(values)
    if values.size > 1:  # drop repeats (a padded shard may read a position twice)
        values = values[np.r_[True, values[1:] != values[:-1]]]
    if not values.size:
        return spans_of([], [])
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    return values[np.r_[0, breaks]], values[np.r_[breaks - 1, values.size - 1]] + 1


def union(parts: Sequence[Spans]) -> Spans:
    """The union of several span sets, sorted and merged."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return spans_of([], [])
    starts = np.concatenate([p[0] for p in parts])
    stops = np.concatenate([p[1] for p in parts])
    order = np.argsort(starts, kind="stable")
    starts, stops = starts[order], stops[order]
    reach = np.maximum.accumulate(stops)
    # A span opens a new merged run when it starts past everything before it.
    new = np.r_[True, starts[1:] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, starts.size - 1]
    return starts[first], reach[last]


def subtract(keep: Spans, drop: Spans) -> Spans:
    """Positions of ``keep`` that are not in ``drop`` (both sorted and disjoint)."""
    if not len(keep[0]) or not len(drop[0]):
        return keep
    points = np.sort(np.concatenate([keep[0], keep[1], drop[0], drop[1]]))
    points = points[np.r_[True, points[1:] != points[:-1]]]
    lo = points[:-1]

    def inside(spans: Spans) -> np.ndarray:
        opened = np.searchsorted(spans[0], lo, side="right")
        closed = np.searchsorted(spans[1], lo, side="right")
        return opened > closed

    kept = inside(keep) & ~inside(drop)
    return union([(lo[kept], points[1:][kept])])


def take(stream: Spans, start: int, stop: int) -> list[tuple[int, int]]:
    """Positions at stream indices ``[start, stop)``, wrapping past the end, as runs in order."""
    total = span_rows(stream)
    offsets = np.concatenate(([0], np.cumsum(stream[1] - stream[0])))
    runs: list[tuple[int, int]] = []
    index = start
    while index < stop:  # one chunk per lap around the stream (padding wraps)
        at = index % total
        end = min(total, at + stop - index)
        first = int(np.searchsorted(offsets, at, side="right")) - 1
        last = int(np.searchsorted(offsets, end - 1, side="right")) - 1
        lo = stream[0][first : last + 1].copy()
        hi = stream[1][first : last + 1].copy()
        lo[0] += at - offsets[first]
        hi[-1] -= offsets[last + 1] - end
        runs.extend(zip(lo.tolist(), hi.tolist(), strict=True))
        index += end - at
    return runs


def stage_size(
    total: int, shard_count: int, batch_size: int, drop_last: bool, first: bool
) -> tuple[int, int]:
    """Rows and batches per shard of a stage over ``total`` positions.

    The first stage follows :func:`sharding.shard_size` (and its errors); a later stage may
    have nothing left to read (0 rows), or too little for a full batch per shard with
    ``drop_last`` (then it reads nothing and the rest is dropped).
    """
    if first:
        return shard_size(total, shard_count, batch_size, drop_last)
    if drop_last:
        batches = total // (shard_count * batch_size)
        return batches * batch_size, batches
    rows = -(-total // shard_count)
    return rows, -(-rows // batch_size)


class EpochOrder:
    """The global order of one epoch: where each piece's rows sit among the positions."""

    def __init__(self, piece_rows: Sequence[int], *, epoch: int, seed: int, shuffle: bool):
        self.piece_rows = [int(rows) for rows in piece_rows]
        self.epoch, self.seed, self.shuffle = epoch, seed, shuffle
        self.order = piece_visit_order(
            len(self.piece_rows), epoch=epoch, seed=seed, shuffle=shuffle
        )
        sizes = np.asarray([self.piece_rows[p] for p in self.order], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(sizes)))
        self.first = np.empty(len(self.order), dtype=np.int64)  # first position of each piece
        self.first[self.order] = self.starts[:-1]
        self.total = int(self.starts[-1])

    def segments(self, runs: Sequence[tuple[int, int]]) -> list[Segment]:
        """Runs of positions cut at piece boundaries, as segments (positions within a piece)."""
        out: list[Segment] = []
        if not runs:
            return out
        bounds = np.asarray(runs, dtype=np.int64)
        first = np.searchsorted(self.starts, bounds[:, 0], side="right") - 1
        last = np.searchsorted(self.starts, bounds[:, 1] - 1, side="right") - 1
        for lo, hi, k, k_last in zip(
            bounds[:, 0].tolist(),
            bounds[:, 1].tolist(),
            first.tolist(),
            last.tolist(),
            strict=True,
        ):
            if k == k_last:  # most runs lie within one piece
                base = int(self.starts[k])
                out.append(Segment(int(self.order[k]), lo - base, hi - base))
                continue
            while lo < hi:
                piece = int(self.order[k])
                end = min(hi, int(self.starts[k + 1]))
                out.append(Segment(piece, lo - int(self.starts[k]), end - int(self.starts[k])))
                lo = end
                k += 1
        return out

    def segment_positions(self, segment: Segment) -> np.ndarray:
        """Global positions of a segment's rows."""
        first = int(self.first[segment.piece])
        return np.arange(first + segment.start, first + segment.stop, dtype=np.int64)


def windows(segments: Sequence[Segment], window: int) -> list[Sequence[Segment]]:
    """A shard's segments grouped into the windows it reads and mixes together.

    A window holds ``window`` runs of segments of one piece: in an ordinary epoch a run is one
    segment, in a resumed one the rows left of a piece may be cut into many, which are still
    read together (a piece is read once per window).
    """
    groups: list[Sequence[Segment]] = []
    current: list[Segment] = []
    runs, last = 0, -1
    for segment in segments:
        if segment.piece != last:
            if runs == window:
                groups.append(current)
                current, runs = [], 0
            runs, last = runs + 1, segment.piece
        current.append(segment)
    if current:
        groups.append(current)
    return groups


class StagePlan:
    """What shard ``shard`` of a stage reads: its segments, rows and batches."""

    def __init__(
        self,
        order: EpochOrder,
        stream: Spans,
        *,
        shard_count: int,
        shard: int,
        batch_size: int,
        drop_last: bool,
        first: bool,
        window: int,
    ) -> None:
        self.order, self.shard, self.window = order, shard, window
        self.rows, self.batches = stage_size(
            span_rows(stream), shard_count, batch_size, drop_last, first
        )
        runs = take(stream, shard * self.rows, (shard + 1) * self.rows) if self.rows else []
        self.segments = order.segments(runs)

    def window_positions(self, number: int, group: Sequence[Segment]) -> np.ndarray:
        """Positions of window ``number``'s rows in the order the shard serves them."""
        where = np.concatenate([self.order.segment_positions(s) for s in group])
        if not self.order.shuffle:
            return where
        mix = window_order(
            where.size,
            window=number,
            shard=self.shard,
            epoch=self.order.epoch,
            seed=self.order.seed,
        )
        return where[mix]

    def served(self, rows: int) -> Spans:
        """Positions of the first ``rows`` rows the shard serves (windows mixed as read)."""
        done: list[Spans] = []
        left = rows
        for number, group in enumerate(windows(self.segments, self.window)):
            if left <= 0:
                break
            size = sum(segment.rows for segment in group)
            if left >= size:
                starts = [int(self.order.first[s.piece]) + s.start for s in group]
                done.append(
                    union(
                        [spans_of(starts, [a + s.rows for a, s in zip(starts, group, strict=True)])]
                    )
                )
            else:
                done.append(spans_from_positions(self.window_positions(number, group)[:left]))
            left -= size
        return union(done)


def read_set(stream: Spans, shard_count: int, rows: int) -> Spans:
    """Every position a stage would read if it ran to its end."""
    runs = take(stream, 0, shard_count * rows)
    return union([spans_of([lo for lo, _ in runs], [hi for _, hi in runs])])


def remaining(
    order: EpochOrder,
    stages: Sequence[Stage],
    *,
    batch_size: int,
    drop_last: bool,
    window: int,
) -> Spans:
    """The positions no finished stage has read and that the epoch is still to read."""
    stream = spans_of([0], [order.total])
    for number, (shard_count, served) in enumerate(stages):
        plans = [
            StagePlan(
                order,
                stream,
                shard_count=shard_count,
                shard=shard,
                batch_size=batch_size,
                drop_last=drop_last,
                first=number == 0,
                window=window,
            )
            for shard in range(shard_count)
        ]
        read = union([plan.served(rows) for plan, rows in zip(plans, served, strict=True)])
        planned = read_set(stream, shard_count, plans[0].rows) if plans[0].rows else read
        stream = subtract(planned, read)
    return stream


def plan_stage(
    piece_rows: Sequence[int],
    *,
    stages: Sequence[Stage],
    shard_count: int,
    shard: int,
    batch_size: int,
    drop_last: bool,
    epoch: int,
    seed: int,
    shuffle: bool,
    window: int,
) -> StagePlan:
    """The plan of ``shard`` in the stage that follows the finished ``stages`` of ``epoch``.

    With no finished stage this is the ordinary epoch (the segments of
    :func:`sharding.plan_shard`).
    """
    order = EpochOrder(piece_rows, epoch=epoch, seed=seed, shuffle=shuffle)
    window = window if shuffle else 1
    stream = remaining(order, stages, batch_size=batch_size, drop_last=drop_last, window=window)
    return StagePlan(
        order,
        stream,
        shard_count=shard_count,
        shard=shard,
        batch_size=batch_size,
        drop_last=drop_last,
        first=not stages,
        window=window,
    )
