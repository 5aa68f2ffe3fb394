"""Worker side: stream this rank's shard of a converted dataset as batches of tensors.

pyarrow, NumPy and torch only; this module must never import pyspark (it runs inside the
training processes, which may have no Spark at all).

Reading is bounded in memory: one *window* of ``shuffle_window`` row groups is read and its
rows mixed at a time. Columns come out of Arrow as NumPy views without a copy, and each batch
is gathered from them in one copy per column into memory it owns (see
:mod:`sparktrain.data.batching`); nothing works row by row in Python. By default one
background thread reads (decodes Parquet, which releases the GIL) the next window while the
caller's thread cuts batches from the current one; ``prefetch`` adds a second thread that
makes batches (and runs ``transform``) ahead of the caller.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from sparktrain.data import resume_state
from sparktrain.data.batching import Arrays, Window, cut
from sparktrain.data.columns import to_numpy
from sparktrain.data.passes import Pass, PieceReader, Source
from sparktrain.data.prefetch import Background
from sparktrain.data.resharding import Stage, StagePlan, pieces_digest, plan_stage, windows
from sparktrain.data.sharding import (
    Segment,
    row_order_in_piece,
    shard_size,
    validate_shard,
    window_order,
)
from sparktrain.errors import ConfigurationError


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
        dataset: Source,
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
        read_ahead: bool = True,
        prefetch: int = 0,
        shuffle_window: int = 4,
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        if num_epochs is not None:
            _check_int("num_epochs", num_epochs, 1, " (or None to repeat forever)")
        _check_int("shuffle_window", shuffle_window, 1)
        _check_int("prefetch", prefetch, 0, " (0 makes batches in the calling thread)")
        if not isinstance(read_ahead, bool):
            raise ConfigurationError(f"read_ahead must be True or False; got {read_ahead!r}")
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
        self._read_ahead = read_ahead
        self._prefetch = prefetch
        self._window = shuffle_window if shuffle else 1
        self._piece_rows = [rows for _, _, rows in dataset.pieces]
        self.cur_shard = cur_shard
        self.shard_count = shard_count
        self.rows_per_epoch, self.batches_per_epoch = shard_size(
            len(dataset), shard_count, batch_size, drop_last
        )
        self._next_epoch = 0
        self._pass: Pass | None = None
        self._closed: resume_state.Cursor | None = None
        # (epoch, finished stages, rows already served, end) for the next pass, once restored.
        self._resume: tuple[int, list[Stage], int, int | None] | None = None
        self._config = {
            "rows": len(dataset),
            "pieces": pieces_digest(self._piece_rows),
            "batch_size": batch_size,
            "drop_last": drop_last,
            "shuffle": shuffle,
            "seed": seed,
            "shuffle_window": self._window,
        }

    def __len__(self) -> int:
        """Batches the next pass yields (after a restore: the rest of the restored pass)."""
        if self._num_epochs is None:
            raise TypeError(
                "a loader with num_epochs=None is endless and has no len(); use "
                "loader.batches_per_epoch"
            )
        if self._resume is None:
            return self._num_epochs * self.batches_per_epoch
        epoch, stages, skip, end = self._resume
        cursor = resume_state.Cursor(
            self._plan,
            epoch=epoch,
            stages=stages,
            skip=skip,
            end=end,
            batch_size=self._batch_size,
        )
        later = (end if end is not None else cursor.epoch + 1) - cursor.epoch - 1
        return max(cursor.left(), 0) + later * self.batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass start at ``epoch`` (its shuffle); call it on every rank.

        After :meth:`load_state_dict`, setting the restored epoch keeps the restored place in
        it; setting another epoch starts that one from its beginning.
        """
        _check_int("epoch", epoch, 0)
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._next_epoch = epoch
        self._closed = None

    def state_dict(self) -> dict[str, Any]:
        """This rank's place in its epochs, as a small dict (torchdata's protocol).

        It counts the batches the caller has taken (not those read ahead): the epoch, the
        rows this rank has served in it, the seed and the settings, never a list of rows.
        Give it back to :meth:`load_state_dict` on the same rank, or join the states of all
        ranks (``sparktrain.checkpoint.save(..., loader=loader)`` does) to resume at any
        number of ranks.
        """
        if self._pass is not None:
            return self._pass.cursor.state(self._config, self.shard_count, self.cur_shard)
        if self._resume is None and self._closed is not None:  # where a closed pass stood
            return self._closed.state(self._config, self.shard_count, self.cur_shard)
        if self._resume is not None:
            epoch, stages, rows, end = self._resume
        else:
            epoch, stages, rows, end = self._next_epoch, [], 0, None
        return resume_state.shard_state(
            self._config,
            epoch=epoch,
            stages=stages,
            shard_count=self.shard_count,
            shard=self.cur_shard,
            rows=rows,
            end=end,
        )

    def load_state_dict(self, state: Any) -> None:
        """Make the next pass go on where a saved state left off.

        Args:
            state: this rank's own earlier :meth:`state_dict` (same shard and shard count),
                or the states of every rank at one step (a list), or their merged state
                (the ``"loader"`` entry of a checkpoint saved with ``loader=``). With all
                ranks' places known, the rest of the epoch is split among this loader's
                ranks, whatever their number: every row the epoch had left is read once
                (padding aside, see :mod:`sparktrain.data.sharding`), in the epoch's shuffle
                order, and later epochs are those of an uninterrupted run at this size.

        Raises:
            ConfigurationError: the state is not a loader state, was saved by a loader
                with other settings or over other data, or is another rank's alone.
        """
        epoch, stages, rows, end = resume_state.pending(
            state,
            config=self._config,
            shard_count=self.shard_count,
            shard=self.cur_shard,
            what="loader",
        )
        self.close()
        self._next_epoch = epoch
        finished = end is not None and epoch >= end
        idle = not stages and not rows and end is None
        self._resume = None if finished or idle else (epoch, stages, rows, end)

    def _plan(self, epoch: int, stages: Sequence[Stage]) -> StagePlan:
        return plan_stage(
            self._piece_rows,
            stages=stages,
            shard_count=self.shard_count,
            shard=self.cur_shard,
            batch_size=self._batch_size,
            drop_last=self._drop_last,
            epoch=epoch,
            seed=self._seed,
            shuffle=self._shuffle,
            window=self._window,
        )

    def __iter__(self) -> Iterator[Any]:
        start, skip = self._next_epoch, 0
        stages: list[Stage] = []
        end: int | None = None
        if self._resume is not None:
            start, stages, skip, end = self._resume
            self._resume = None
        elif self._num_epochs is not None:
            end = start + self._num_epochs
        if end is not None:
            self._next_epoch = end
        cursor = resume_state.Cursor(
            self._plan,
            epoch=start,
            stages=stages,
            skip=skip,
            end=end,
            batch_size=self._batch_size,
        )
        epochs: Iterable[int] = (
            itertools.count(cursor.epoch) if end is None else range(cursor.epoch, end)
        )
        # One pass at a time keeps memory bounded: a pass left early (break) would otherwise
        # keep its threads and windows until the loader closes.
        if self._pass is not None:
            self._pass.close(superseded=True)
        windows: Iterator[Window] = self._windows(epochs, cursor.plan, cursor.skip)
        reader: list[Background[Window]] = []
        if self._read_ahead:
            reader.append(Background(windows, 1, "sparktrain-data-read"))
            windows = reader[0]
        batches: Iterator[Any] = self._batches(windows)
        if self._prefetch:
            batches = Background(batches, self._prefetch, "sparktrain-data-batch")
        self._pass = Pass(batches, cursor, *reader)
        self._closed = None
        return self._pass

    def close(self) -> None:
        """Stop the current pass's background threads and close its files.

        :meth:`state_dict` still says where the pass stood, until the next pass or
        :meth:`set_epoch`.
        """
        if self._pass is not None:
            self._pass.close()
            self._closed = self._pass.cursor
            self._pass = None

    def __enter__(self) -> TorchDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _windows(self, epochs: Iterable[int], first: StagePlan, skip: int) -> Iterator[Window]:
        """The windows of ``epochs``; the first follows ``first``, less ``skip`` served rows."""
        reader = PieceReader(self._dataset, list(self._kinds))
        shapes: dict[str, tuple[int, ...]] = {}
        try:
            for epoch in epochs:
                plan = first if epoch == first.order.epoch else self._plan(epoch, ())
                left = skip if plan is first else 0
                served_batches = left // self._batch_size
                groups = windows(plan.segments, self._window)
                for number, segments in enumerate(groups):
                    size = sum(segment.rows for segment in segments)
                    if left >= size:
                        left -= size  # served before the restore: not read again
                        continue
                    window = self._read_window(reader, segments, epoch, number)
                    if left:
                        window.drop_first(left)
                        left = 0
                    for part in window.parts:
                        for name, values in part.items():
                            if shapes.setdefault(name, values.shape[1:]) != values.shape[1:]:
                                raise ConfigurationError(
                                    f"column {name!r} changes width within the dataset "
                                    f"({shapes[name]} then {values.shape[1:]}); the loader "
                                    f"needs one array length or vector size per column"
                                )
                    window.last = number == len(groups) - 1
                    window.batches = plan.batches - served_batches
                    yield window
        finally:
            reader.close()

    def _read_window(
        self, reader: PieceReader, segments: Sequence[Segment], epoch: int, number: int
    ) -> Window:
        """Read a window's segments; when shuffling, mix their rows with a seeded order.

        The columns stay as Arrow produced them (no copy); only the order is computed here.
        """
        if not self._shuffle and len(segments) == 1:
            (segment,) = segments
            table = reader.read(segment.piece).slice(segment.start, segment.rows)
            return Window(epoch, [self._convert(table)], None, None, segment.rows, False, 0)
        parts: list[Arrays] = []
        index: dict[int, int] = {}  # piece -> its part (a resumed epoch may cut a piece up)
        rows: list[np.ndarray] = []
        owners: list[int] = []
        local: dict[int, np.ndarray] = {}  # each piece's row order, computed once
        for segment in segments:
            if segment.piece not in index:
                table = reader.read(segment.piece)
                index[segment.piece] = len(parts)
                parts.append(self._convert(table))
                count = self._piece_rows[segment.piece]
                order = row_order_in_piece(
                    count,
                    piece=segment.piece,
                    epoch=epoch,
                    seed=self._seed,
                    shuffle=self._shuffle,
                )
                local[segment.piece] = np.arange(count) if order is None else order
            rows.append(local[segment.piece][segment.start : segment.stop])
            owners.append(index[segment.piece])
        row_of = np.concatenate(rows)
        mix = (
            window_order(
                len(row_of), window=number, shard=self.cur_shard, epoch=epoch, seed=self._seed
            )
            if self._shuffle
            else np.arange(len(row_of))
        )
        part_of = None
        if len(parts) > 1:
            sizes = [len(part_rows) for part_rows in rows]
            part_of = np.repeat(np.asarray(owners, dtype=np.int32), sizes)[mix]
        return Window(epoch, parts, row_of[mix], part_of, len(row_of), False, 0)

    def _convert(self, table: pa.Table) -> Arrays:
        return {
            name: to_numpy(name, kind, table.column(name), self._dataset.dtype)
            for name, kind in self._kinds.items()
        }

    def _batches(self, windows: Iterator[Window]) -> Iterator[Any]:
        """Cut the windows of each epoch into batches of tensors (and apply ``transform``)."""
        try:
            for arrays in cut(windows, self._batch_size, self.cur_shard):
                batch: dict[str, Any] = {
                    name: values.tolist() if values.dtype == object else torch.from_numpy(values)
                    for name, values in arrays.items()
                }
                yield batch if self._transform is None else self._transform(batch)
        finally:
            close = getattr(windows, "close", None)
            if close is not None:
                close()


def _check_int(name: str, value: object, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}{hint}; got {value!r}")
