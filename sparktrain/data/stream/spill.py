"""A rank's first epoch, spilled to local disk as it streams in, for the epochs after it.

The spill is an Arrow IPC file (``epoch.arrow``) of the batches exactly as they arrived, in a
folder of its own under ``<local_dir>/sparktrain-<uid>/stream-spills/`` (the private folder's
rules: 0700, checked with ``lstat``, files created with ``O_EXCL | O_NOFOLLOW``). The folder
is locked by its owner while it lives (:mod:`sparktrain.locked_dirs`); it is removed when the
loader closes, and a process that died without closing (SIGKILL, OOM) leaves a folder whose
lock anyone can take: :func:`sweep` (run by every new spill) removes exactly those.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from sparktrain import locked_dirs, private_dir
from sparktrain.data.stream.protocol import StreamError

SPILLS = "stream-spills"
FILE_NAME = "epoch.arrow"
PREFIX = "spill-"


class Spill:
    """One rank's spill: write the first epoch's batches, read them back for later epochs.

    Args:
        local_dir: the folder to keep it under (Spark's local dir on an executor); default
            the temporary folder.
    """

    def __init__(self, local_dir: str | Path | None = None) -> None:
        base = private_dir.usable_folder(SPILLS, local_dir)
        sweep(base)
        self.folder, self._lock = locked_dirs.make_locked(base, PREFIX)
        self.path = self.folder / FILE_NAME
        self._file: BinaryIO | None = None
        self._writer: pa.RecordBatchFileWriter | None = None
        self.complete = False
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Append one batch.

        Raises:
            StreamError: the disk is full (naming the folder and the bytes needed), or the
                batch's schema differs from the first one's.
        """
        try:
            if self._writer is None:
                fd = os.open(self.path, private_dir.EXCLUSIVE, 0o600)
                self._file = os.fdopen(fd, "wb")
                self._writer = pa.ipc.new_file(self._file, batch.schema)
            self._writer.write_batch(batch)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space" in str(exc):
                raise StreamError(
                    f"the disk of {self.folder} is full: the first epoch's spill needs at least "
                    f"{batch.nbytes} more bytes (it holds {self.rows} rows so far). Free space "
                    f"there, or point the loader's local_dir (Spark's spark.local.dir) at a "
                    f"larger disk"
                ) from exc
            raise
        except pa.ArrowInvalid as exc:
            raise StreamError(f"a batch's schema differs from the stream's first: {exc}") from exc
        self.rows += batch.num_rows

    def finish(self) -> None:
        """The first epoch is whole: close the file, so later epochs can read it."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self.complete = True

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The spilled batches, in the order they arrived, read one at a time (not memory-mapped:
        a mapped file's pages would count in the rank's resident memory as it reads on)."""
        if not self.complete:
            raise StreamError("the first epoch was not read to its end, so it has no spill")
        if self.rows == 0 and not self.path.exists():
            return
        with pa.OSFile(str(self.path), "rb") as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def close(self) -> None:
        """Remove the spill (idempotent)."""
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
        if self._file is not None:
            with contextlib.suppress(OSError):  # a full disk fails the flush: the file goes
                self._file.close()
            self._file = None
        self._writer = None
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


def sweep(base: Path) -> list[Path]:
    """Remove the spills in ``base`` whose owner is gone (see
    :func:`sparktrain.locked_dirs.sweep`)."""
    return locked_dirs.sweep(base, PREFIX, "spills")
