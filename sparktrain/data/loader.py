"""Worker side: stream this rank's shard of a converted dataset as batches of tensors.

pyarrow, NumPy and torch only; this module must never import pyspark (it runs inside the
training processes, which may have no Spark at all).

Reading is bounded in memory: one *window* of ``shuffle_window`` row groups is read, mixed and
cut into batches at a time. Two background threads overlap the work with training: one reads
and mixes the next window while the other cuts batches (and runs ``transform``) up to
``prefetch`` batches ahead.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from sparktrain.data.columns import to_numpy
from sparktrain.data.prefetch import Background
from sparktrain.data.sharding import (
    plan_shard,
    row_order_in_piece,
    shard_size,
    validate_shard,
    window_order,
)
from sparktrain.errors import ConfigurationError, SparkTrainError

if TYPE_CHECKING:
    from sparktrain.data.dataset import SparkDatasetConverter

Arrays = dict[str, np.ndarray]

# Parquet files kept open per pass (pieces of one file are often visited close together).
_OPEN_FILES = 4


@dataclasses.dataclass
class _Block:
    """Rows of one window, mixed, with the epoch bookkeeping the batcher needs."""

    epoch: int
    arrays: Arrays
    rows: int
    last: bool
    batches: int


class _Pass(Iterator[Any]):
    """One pass over the loader; a newer pass stops it, and then it raises if used."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self._superseded = False

    def __next__(self) -> Any:
        if self._superseded:
            raise SparkTrainError(
                "this pass over the data loader was stopped because a newer pass started "
                "(iter(loader) was called again); use one iterator per loader at a time, or "
                "make a second loader"
            )
        return next(self._batches)

    def close(self, superseded: bool = False) -> None:
        """Stop the pass's threads and close its files."""
        self._superseded = superseded
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


class _PieceReader:
    """Reads row groups of a dataset, keeping the last few files open."""

    def __init__(self, dataset: SparkDatasetConverter, columns: Sequence[str]) -> None:
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


class TorchDataLoader:
    """This rank's shard of a converted dataset, as batches (dicts of tensors).

    Use it as a context manager; each pass (``for batch in loader``) runs ``num_epochs``
    epochs and the next pass continues with the following epoch numbers, so every epoch has
    its own shuffle (``set_epoch`` sets the number explicitly). Starting a pass stops the
    previous one, so a pass left early (``break``) frees its threads and memory. Numbers become 1-D tensors,
    arrays and ML vectors 2-D tensors, binary and string columns lists.

    Made by :meth:`SparkDatasetConverter.make_torch_dataloader`, which documents the
    arguments.

    Attributes:
        batches_per_epoch: batches each rank yields per epoch (the same on every rank).
        rows_per_epoch: rows each rank yields per epoch (the same on every rank).
        cur_shard: this rank's shard.
        shard_count: number of shards.
    """

    def __init__(
        self,
        dataset: SparkDatasetConverter,
        batch_size: int,
        *,
        num_epochs: int | None = 1,
        shuffle: bool = True,
        seed: int = 0,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        drop_last: bool = False,
        prefetch: int = 4,
        shuffle_window: int = 4,
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        if num_epochs is not None:
            _check_int("num_epochs", num_epochs, 1, " (or None to repeat forever)")
        _check_int("shuffle_window", shuffle_window, 1)
        _check_int("prefetch", prefetch, 0, " (0 reads in the calling thread)")
        _check_int("seed", seed, 0)
        if transform is not None and not callable(transform):
            raise ConfigurationError(f"transform must be callable; got {transform!r}")
        if (cur_shard is None) != (shard_count is None):
            raise ConfigurationError(
                "give both cur_shard and shard_count, or neither (then the run's rank and "
                "world size are used)"
            )
        if cur_shard is None or shard_count is None:
            from sparktrain.worker import context

            cur_shard, shard_count = context.rank(), context.world_size()
        validate_shard(cur_shard, shard_count)

        self._dataset = dataset
        self._kinds = dataset.column_kinds(columns)
        self._batch_size = batch_size
        self._num_epochs = num_epochs
        self._shuffle = shuffle
        self._seed = seed
        self._transform = transform
        self._drop_last = drop_last
        self._prefetch = prefetch
        self._window = shuffle_window if shuffle else 1
        self._piece_rows = [rows for _, _, rows in dataset.pieces]
        self.cur_shard = cur_shard
        self.shard_count = shard_count
        self.rows_per_epoch, self.batches_per_epoch = shard_size(
            len(dataset), shard_count, batch_size, drop_last
        )
        self._next_epoch = 0
        self._pass: _Pass | None = None

    def __len__(self) -> int:
        if self._num_epochs is None:
            raise TypeError(
                "a loader with num_epochs=None is endless and has no len(); use "
                "loader.batches_per_epoch"
            )
        return self._num_epochs * self.batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass start at ``epoch`` (its shuffle); call it on every rank."""
        _check_int("epoch", epoch, 0)
        self._next_epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        start = self._next_epoch
        epochs: Iterable[int]
        if self._num_epochs is None:
            epochs = itertools.count(start)
        else:
            epochs = range(start, start + self._num_epochs)
            self._next_epoch = start + self._num_epochs
        batches: Iterator[Any]
        if self._prefetch == 0:
            batches = self._batches(self._blocks(epochs))
        else:
            blocks = Background(self._blocks(epochs), 1, "sparktrain-data-read")
            batches = Background(self._batches(blocks), self._prefetch, "sparktrain-data-batch")
        # One pass at a time keeps memory bounded: a pass left early (break) would otherwise
        # keep its threads and windows until the loader closes.
        if self._pass is not None:
            self._pass.close(superseded=True)
        self._pass = _Pass(batches)
        return self._pass

    def close(self) -> None:
        """Stop the current pass's background threads and close its files."""
        if self._pass is not None:
            self._pass.close()
            self._pass = None

    def __enter__(self) -> TorchDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _blocks(self, epochs: Iterable[int]) -> Iterator[_Block]:
        reader = _PieceReader(self._dataset, list(self._kinds))
        shapes: dict[str, tuple[int, ...]] = {}
        try:
            for epoch in epochs:
                plan = plan_shard(
                    self._piece_rows,
                    shard_count=self.shard_count,
                    cur_shard=self.cur_shard,
                    batch_size=self._batch_size,
                    drop_last=self._drop_last,
                    epoch=epoch,
                    seed=self._seed,
                    shuffle=self._shuffle,
                )
                windows = [
                    plan.segments[i : i + self._window]
                    for i in range(0, len(plan.segments), self._window)
                ]
                for number, window in enumerate(windows):
                    arrays, rows = self._read_window(reader, window, epoch, number)
                    for name, values in arrays.items():
                        if shapes.setdefault(name, values.shape[1:]) != values.shape[1:]:
                            raise ConfigurationError(
                                f"column {name!r} changes width within the dataset "
                                f"({shapes[name]} then {values.shape[1:]}); the loader needs "
                                f"one array length or vector size per column"
                            )
                    last = number == len(windows) - 1
                    yield _Block(epoch, arrays, rows, last, plan.batches)
        finally:
            reader.close()

    def _read_window(
        self, reader: _PieceReader, window: Sequence[Any], epoch: int, number: int
    ) -> tuple[Arrays, int]:
        """Read a window's segments; when shuffling, mix their rows with a seeded order."""
        parts: list[Arrays] = []
        positions: list[np.ndarray] = []
        offset = 0
        for segment in window:
            table = reader.read(segment.piece)
            order = row_order_in_piece(
                table.num_rows,
                piece=segment.piece,
                epoch=epoch,
                seed=self._seed,
                shuffle=self._shuffle,
            )
            if order is None:
                table = table.slice(segment.start, segment.rows)
                local = np.arange(segment.rows)
            elif segment.rows == table.num_rows:
                local = order
            else:
                table = table.take(pa.array(order[segment.start : segment.stop]))
                local = np.arange(segment.rows)
            parts.append(self._convert(table))
            positions.append(local + offset)
            offset += table.num_rows
        if not self._shuffle:
            # The arrays may view read-only Arrow memory; batches must own writable memory.
            return {n: np.require(v, requirements=["W"]) for n, v in parts[0].items()}, offset
        index = np.concatenate(positions)
        index = index[
            window_order(
                len(index), window=number, shard=self.cur_shard, epoch=epoch, seed=self._seed
            )
        ]
        if len(parts) == 1:
            return {n: v[index] for n, v in parts[0].items()}, len(index)
        return {n: np.concatenate([part[n] for part in parts])[index] for n in parts[0]}, len(index)

    def _convert(self, table: pa.Table) -> Arrays:
        return {
            name: to_numpy(name, kind, table.column(name), self._dataset.dtype)
            for name, kind in self._kinds.items()
        }

    def _batches(self, blocks: Iterator[_Block]) -> Iterator[Any]:
        """Cut the blocks of each epoch into batches of ``batch_size`` rows."""
        try:
            yield from self._cut(blocks)
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()

    def _cut(self, blocks: Iterator[_Block]) -> Iterator[Any]:
        size = self._batch_size
        carry: list[Arrays] = []
        carried = 0
        made = 0
        for block in blocks:
            start = 0
            if carried:
                take = min(size - carried, block.rows)
                carry.append({n: v[:take] for n, v in block.arrays.items()})
                carried += take
                start = take
                if carried == size:
                    yield self._emit(_concat(carry))
                    made, carry, carried = made + 1, [], 0
            while block.rows - start >= size:
                yield self._emit({n: v[start : start + size] for n, v in block.arrays.items()})
                made, start = made + 1, start + size
            if start < block.rows:
                carry.append({n: v[start:] for n, v in block.arrays.items()})
                carried += block.rows - start
            if block.last:
                if carried:
                    yield self._emit(_concat(carry))
                    made, carry, carried = made + 1, [], 0
                if made != block.batches:
                    raise SparkTrainError(
                        f"internal error: shard {self.cur_shard} made {made} batches in epoch "
                        f"{block.epoch} instead of {block.batches}; please report this bug"
                    )
                made = 0

    def _emit(self, arrays: Arrays) -> Any:
        batch: dict[str, Any] = {
            name: values.tolist() if values.dtype == object else torch.from_numpy(values)
            for name, values in arrays.items()
        }
        return batch if self._transform is None else self._transform(batch)


def _concat(parts: list[Arrays]) -> Arrays:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _check_int(name: str, value: object, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}{hint}; got {value!r}")
