"""Windows of rows cut into batches, each batch gathered straight from Arrow column memory.

Worker side: NumPy only, never pyspark.

A :class:`Window` holds the column arrays of the row groups it was read from as they came out
of Arrow (NumPy views of Arrow buffers, no copy) and the order in which their rows are served.
:func:`cut` makes batches of ``batch_size`` rows across windows; each batch is filled in one
copy per column, from those views into memory the batch owns (and that ``torch.from_numpy``
then wraps without a copy). No step works row by row in Python, and no window is ever copied
as a whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from sparktrain.errors import SparkTrainError

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass
class Window:
    """The rows of a few row groups, served together in one order.

    Attributes:
        epoch: the epoch the rows belong to.
        parts: for each row group read, its column arrays (may view read-only Arrow memory).
        row_of: for each served row, in order, its row in its part; ``None`` serves part 0's
            rows in their stored order.
        part_of: for each served row, in order, the index of its part; ``None`` when there is
            one part.
        rows: number of rows served.
        last: whether this is the last window of its epoch.
        batches: batches the epoch yields (checked when its last window is cut).
    """

    epoch: int
    parts: list[Arrays]
    row_of: np.ndarray | None
    part_of: np.ndarray | None
    rows: int
    last: bool
    batches: int

    def drop_first(self, rows: int) -> None:
        """Leave out the first ``rows`` served rows (served before a restore)."""
        if self.row_of is None:
            self.parts = [{name: values[rows:] for name, values in self.parts[0].items()}]
        else:
            self.row_of = self.row_of[rows:]
            if self.part_of is not None:
                self.part_of = self.part_of[rows:]
        self.rows -= rows

    def fill(self, out: Arrays, lo: int, hi: int, at: int) -> None:
        """Copy served rows ``lo:hi`` of every column into ``out`` from row ``at`` on."""
        stop = at + hi - lo
        if self.row_of is None:
            for name, target in out.items():
                target[at:stop] = self.parts[0][name][lo:hi]
            return
        rows = self.row_of[lo:hi]
        if self.part_of is None:
            for name, target in out.items():
                _take(self.parts[0][name], rows, target[at:stop])
            return
        owners = self.part_of[lo:hi]
        for index, part in enumerate(self.parts):
            where = np.flatnonzero(owners == index)
            if where.size:
                picked = rows[where]
                where += at
                for name, target in out.items():
                    target[where] = part[name][picked]


def _take(source: np.ndarray, rows: np.ndarray, target: np.ndarray) -> None:
    if source.dtype == target.dtype and source.dtype != object:
        # mode="clip" writes straight into target (the default mode buffers a copy first);
        # the rows are in range by construction.
        np.take(source, rows, axis=0, out=target, mode="clip")
    else:
        target[...] = source[rows]


def _allocate(like: Arrays, rows: int) -> Arrays:
    return {
        name: np.empty((rows, *values.shape[1:]), dtype=values.dtype)
        for name, values in like.items()
    }


def cut(windows: Iterator[Window], batch_size: int, shard: int) -> Iterator[Arrays]:
    """Batches of ``batch_size`` rows (the epoch's last may be shorter), as NumPy arrays.

    A batch may take rows from two windows; an epoch's last batch never takes rows from the
    next epoch.

    Args:
        windows: the windows of one or more epochs, in order.
        batch_size: rows per batch.
        shard: this shard's number, for the internal check's message.

    Yields:
        Dicts of arrays that own their memory (writable, contiguous).

    Raises:
        SparkTrainError: an epoch made a different number of batches than planned (a bug).
    """
    spans: list[tuple[Window, int, int]] = []
    pending = 0
    made = 0
    for window in windows:
        start = 0
        while start < window.rows:
            take = min(batch_size - pending, window.rows - start)
            spans.append((window, start, start + take))
            pending += take
            start += take
            if pending == batch_size:
                yield _assemble(spans, pending)
                spans, pending, made = [], 0, made + 1
        if window.last:
            if pending:
                yield _assemble(spans, pending)
                spans, pending, made = [], 0, made + 1
            if made != window.batches:
                raise SparkTrainError(
                    f"internal error: shard {shard} made {made} batches in epoch "
                    f"{window.epoch} instead of {window.batches}; please report this bug"
                )
            made = 0


def _assemble(spans: list[tuple[Window, int, int]], rows: int) -> Arrays:
    out = _allocate(spans[0][0].parts[0], rows)
    at = 0
    for window, lo, hi in spans:
        window.fill(out, lo, hi, at)
        at += hi - lo
    return out
