"""Driver side, for ``np < 0``: a Spark DataFrame as Arrow record batches, a piece at a time.

``df.toLocalIterator()`` brings one partition at a time to the driver (never the whole
DataFrame), and its rows are grouped into record batches of ``rows`` rows, so the driver holds
at most one partition and one batch. Works with a classic session and with Spark Connect
(both have ``toLocalIterator``); no pyspark import here. ML vectors become lists of floats
(2-D tensors, as the column rules make of them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa


class _Frame(Protocol):
    columns: list[str]

    def toLocalIterator(self) -> Iterator[Sequence[Any]]: ...  # noqa: N802 (Spark's name)


def dataframe_batches(df: _Frame, rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Record batches of ``rows`` rows (the last may be shorter) of ``df``'s rows, in order.

    Args:
        df: a Spark DataFrame (classic or Connect).
        rows: rows per batch.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, not {rows}")
    names = list(df.columns)
    schema: pa.Schema | None = None
    chunk: list[Sequence[Any]] = []
    for row in df.toLocalIterator():
        chunk.append(row)
        if len(chunk) == rows:
            batch = _batch(chunk, names, schema)
            schema = batch.schema
            yield batch
            chunk = []
    if chunk:
        yield _batch(chunk, names, schema)


def _batch(
    chunk: list[Sequence[Any]], names: list[str], schema: pa.Schema | None
) -> pa.RecordBatch:
    arrays = []
    for i, name in enumerate(names):
        values = [_plain(row[i]) for row in chunk]
        known = schema.field(name).type if schema is not None else None
        typed = known is not None and not pa.types.is_null(known)
        arrays.append(pa.array(values, type=known if typed else None))
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _plain(value: Any) -> Any:
    to_array = getattr(value, "toArray", None)
    if to_array is not None:  # a pyspark.ml / mllib vector
        return to_array().tolist()
    return value
