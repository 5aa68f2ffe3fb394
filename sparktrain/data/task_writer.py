"""Driver side: write a DataFrame as Parquet from the Spark tasks, through fsspec.

Spark's own writer reaches only the file systems its Hadoop configuration knows: without the
S3A jars, ``s3a://`` fails with ``ClassNotFoundException``, and ``s3://`` or ``gs://`` may
have no implementation at all. Here each task writes its partition with pyarrow to the fsspec
URL instead, so any store the ranks can read (with the same ``storage_options``) can hold the
cache. pyspark is imported inside functions only.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from sparktrain.data.dataset import filesystem
from sparktrain.shipping.python_probe import sparktrain_python

WRITERS = ("auto", "spark", "tasks")
PART_PREFIX = "part-"


def spark_lacks_filesystem(exc: BaseException) -> bool:
    """Whether Spark's writer failed because its Hadoop has no file system for the URL."""
    text = str(exc)
    return (
        "UnsupportedFileSystemException" in text
        or "No FileSystem for scheme" in text
        or ("ClassNotFoundException" in text and "FileSystem" in text)
    )


def write_from_tasks(
    df: Any,
    url: str,
    *,
    row_group_size_bytes: int,
    storage_options: Mapping[str, Any] | None,
) -> tuple[list[str], dict[str, list[Any]]]:
    """Write ``df`` as Parquet files under ``url``, one per non-empty partition.

    What was under ``url`` is removed first (a directory without a manifest is an earlier,
    unfinished write). Files left by failed or speculative task attempts are removed after
    the job, so only the files of the attempts Spark counted remain.

    Returns:
        The written file names, relative to ``url``, in partition order, and each one's size
        and SHA-256 as its task wrote it (see :mod:`sparktrain.data.integrity`).
    """
    fs, root = filesystem(url, storage_options)
    if fs.exists(root):
        fs.rm(root, recursive=True)
    fs.makedirs(root, exist_ok=True)
    write = _partition_writer(url, dict(storage_options or {}), row_group_size_bytes)
    with sparktrain_python(df.sparkSession, data=True):
        stage = df.mapInArrow(write, "partition long, file string, size long, sha256 string")
    rows = stage.collect()
    written = [row for row in sorted(rows, key=lambda row: row["partition"]) if row["file"]]
    names = [row["file"] for row in written]
    _remove_strays(fs, root, set(names))
    return names, {row["file"]: [row["size"], row["sha256"]] for row in written}


def _partition_writer(url: str, options: dict[str, Any], group_bytes: int) -> Any:
    """The function each task runs over its partition's Arrow batches."""
    prefix = PART_PREFIX  # the name _remove_strays looks for

    # A closure, so cloudpickle ships it by value and the executors need nothing importable
    # beyond pyarrow and fsspec (which the ranks need anyway to read the files).
    def write(batches: Any) -> Any:
        import hashlib
        import posixpath
        import uuid

        import fsspec.core
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        fs, root = fsspec.core.url_to_fs(url, **options)
        name = f"{prefix}{partition:05d}-{uuid.uuid4().hex[:12]}.parquet"
        pending: list[Any] = []
        group_rows = 0  # rows per row group, from the first batch's bytes per row
        sink = writer = None
        digest = hashlib.sha256()
        size = 0

        class Hashing:
            """The file as written, hashed on its way out (no second read)."""

            closed = False

            def __init__(self, raw: Any) -> None:
                self.raw = raw

            def write(self, data: Any) -> int:
                nonlocal size
                digest.update(data)
                size += len(data)
                self.raw.write(data)
                return len(data)

            def tell(self) -> int:
                return size

            def flush(self) -> None:
                self.raw.flush()

            def close(self) -> None:
                self.closed = True
                self.raw.close()

            def writable(self) -> bool:
                return True

        def flush(rows: int) -> None:
            # Whole row groups of about group_bytes of Arrow data (like parquet.block.size);
            # what is left over stays pending.
            nonlocal sink, writer
            table = pa.Table.from_batches(pending)
            if writer is None:
                sink = Hashing(fs.open(posixpath.join(root, name), "wb"))
                writer = pq.ParquetWriter(sink, table.schema)
            writer.write_table(table.slice(0, rows), row_group_size=group_rows)
            pending[:] = table.slice(rows).to_batches()

        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                if not group_rows:
                    group_rows = max(1, group_bytes * batch.num_rows // max(1, batch.nbytes))
                pending.append(batch)
                rows = sum(b.num_rows for b in pending)
                if rows >= group_rows:
                    flush(rows - rows % group_rows)
            if pending:
                flush(sum(b.num_rows for b in pending))
        finally:
            if writer is not None:
                writer.close()
            if sink is not None:
                sink.close()
        written = writer is not None
        yield pa.RecordBatch.from_pydict(
            {
                "partition": [partition],
                "file": [name if written else None],
                "size": [size],
                "sha256": [digest.hexdigest()],
            },
            schema=pa.schema(
                [
                    ("partition", pa.int64()),
                    ("file", pa.string()),
                    ("size", pa.int64()),
                    ("sha256", pa.string()),
                ]
            ),
        )

    return write


def _remove_strays(fs: Any, root: str, keep: set[str]) -> None:
    """Remove part files under ``root`` that no counted task attempt reported."""
    for path in fs.find(root):
        name = posixpath.basename(path)
        if name.startswith(PART_PREFIX) and name not in keep:
            try:
                fs.rm(path)
            except FileNotFoundError:
                pass
