"""Rows of a stream, shuffled within a buffer, cut into batches and turned into tensors.

Worker side: pyarrow, NumPy and torch, never pyspark. The column rules are those of
:mod:`sparktrain.data.columns` (as for ``make_torch_dataloader``): numbers -> 1-D tensors,
arrays and ML vectors -> 2-D tensors, binary and strings -> lists for the user's ``transform``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from sparktrain.data import columns as column_rules
from sparktrain.data.columns import ColumnKind
from sparktrain.errors import ConfigurationError


def shuffled(
    batches: Iterable[pa.RecordBatch], buffer_rows: int, rng: np.random.Generator
) -> Iterator[pa.Table]:
    """The rows of ``batches`` in an order drawn by ``rng`` from a buffer of ``buffer_rows``.

    Rows are held until ``2 * buffer_rows`` are in hand; then a random ``n - buffer_rows`` of
    them go out (so the work per row stays constant) and the rest wait; at the end all that
    wait go out in random order. ``buffer_rows <= 0`` passes the rows through in order. The
    order depends only on the batches and ``rng``'s seed: the same seed and epoch give the
    same order.
    """
    if buffer_rows <= 0:
        for batch in batches:
            yield pa.Table.from_batches([batch])
        return
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        if count >= 2 * buffer_rows:
            table = pa.Table.from_batches(held)
            order = rng.permutation(count)
            yield table.take(order[: count - buffer_rows])
            held = table.take(order[count - buffer_rows :]).combine_chunks().to_batches()
            count = buffer_rows
    if count:
        table = pa.Table.from_batches(held)
        yield table.take(rng.permutation(count))


def cut(tables: Iterable[pa.Table], batch_size: int, drop_last: bool) -> Iterator[pa.Table]:
    """Re-cut ``tables`` into tables of ``batch_size`` rows (the last one short unless
    ``drop_last``); slices, no copies."""
    pending: list[pa.Table] = []
    count = 0
    for table in tables:
        if not table.num_rows:
            continue
        pending.append(table)
        count += table.num_rows
        if count < batch_size:
            continue
        whole = pa.concat_tables(pending)
        start = 0
        while count - start >= batch_size:
            yield whole.slice(start, batch_size)
            start += batch_size
        pending = [whole.slice(start)] if start < count else []
        count -= start
    if count and not drop_last:
        yield pa.concat_tables(pending)


def plan(schema: pa.Schema, wanted: Sequence[str] | None) -> dict[str, ColumnKind]:
    """Each column to serve and its kind.

    Raises:
        ConfigurationError: a wanted column is missing, or a column cannot become a tensor
            (naming it and the fix).
    """
    if wanted is not None:
        missing = [name for name in wanted if name not in schema.names]
        if missing:
            raise ConfigurationError(
                f"columns={list(wanted)!r} names {missing!r}, which the stream does not have; "
                f"its columns are {schema.names!r}"
            )
    names = list(wanted) if wanted is not None else schema.names
    return {name: column_rules.column_kind(schema.field(name)) for name in names}


def to_tensors(table: pa.Table, kinds: dict[str, ColumnKind]) -> dict[str, Any]:
    """One batch as a dict: tensors for numbers, arrays and vectors; lists for binary."""
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        values = column_rules.to_numpy(name, kind, table.column(name))
        if kind is ColumnKind.BINARY:
            out[name] = values.tolist()
            continue
        if not values.flags.writeable:
            values = np.array(values)
        out[name] = torch.from_numpy(values)
    return out
