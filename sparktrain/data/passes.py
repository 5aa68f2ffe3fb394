"""What a loader pass is made of: the source it reads, its row-group reader, its iterator.

pyarrow and the loader's own modules only; never pyspark.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa

from sparktrain.data import resume_state
from sparktrain.data.columns import ColumnKind
from sparktrain.data.prefetch import Background
from sparktrain.errors import SparkTrainError


class Source(Protocol):
    """What a loader reads: a :class:`~sparktrain.data.dataset.SparkDatasetConverter`, which
    makes loaders (so this module names what it needs of one instead of importing it)."""

    @property
    def pieces(self) -> tuple[tuple[int, int, int], ...]:
        """``(file index, row group, rows)`` of every non-empty row group."""

    @property
    def dtype(self) -> str | None:
        """Float dtype of floating-point columns in batches (None: keep)."""

    def __len__(self) -> int:
        """Rows in all."""

    def column_kinds(self, columns: Sequence[str] | None = None) -> dict[str, ColumnKind]:
        """The kind of each requested column, checking names and types."""

    def open_file(self, index: int) -> tuple[Any, Any]:
        """Open file ``index``: the Parquet file and a handle to close."""


# Parquet files kept open per pass (pieces of one file are often visited close together).
_OPEN_FILES = 4


class Pass(Iterator[Any]):
    """One pass over the loader; a newer pass stops it, and then it raises if used."""

    def __init__(
        self, batches: Iterator[Any], cursor: resume_state.Cursor, *threads: Background[Any]
    ) -> None:
        # The read-ahead thread behind ``batches`` is closed by name as well: closing a
        # generator that never ran does not run its ``finally``, which would close it.
        self._batches = batches
        self.cursor = cursor
        self._stages: tuple[Iterator[Any], ...] = (batches, *threads)
        self._superseded = False

    def __next__(self) -> Any:
        if self._superseded:
            raise SparkTrainError(
                "this pass over the data loader was stopped because a newer pass started "
                "(iter(loader) was called again); use one iterator per loader at a time, or "
                "make a second loader"
            )
        batch = next(self._batches)
        self.cursor.served_batch()
        return batch

    def close(self, superseded: bool = False) -> None:
        """Stop the pass's threads and close its files."""
        self._superseded = superseded
        for stage in self._stages:
            close = getattr(stage, "close", None)
            if close is not None:
                close()


class PieceReader:
    """Reads row groups of a dataset, keeping the last few files open."""

    def __init__(self, dataset: Source, columns: Sequence[str]) -> None:
        self._dataset = dataset
        self._columns = list(columns)
        self._open: collections.OrderedDict[int, tuple[Any, Any]] = collections.OrderedDict()

    def read(self, piece: int) -> pa.Table:
        file_index, group, _ = self._dataset.pieces[piece]
        if file_index in self._open:
            self._open.move_to_end(file_index)
        else:
            self._open[file_index] = self._dataset.open_file(file_index)
            if len(self._open) > _OPEN_FILES:
                _, (_, handle) = self._open.popitem(last=False)
                handle.close()
        parquet, _ = self._open[file_index]
        return parquet.read_row_group(group, columns=self._columns)

    def close(self) -> None:
        while self._open:
            _, (_, handle) = self._open.popitem()
            handle.close()
