"""Worker side: a data cache's part file, opened only as the bytes its manifest recorded.

The converter checks every part file against its recorded size and SHA-256 when it reuses a
cache (see :mod:`sparktrain.data.integrity`), but a file can be swapped after that check, or
while a rank reads it. So the ranks check each file as they open it, and decode only the bytes
they hashed:

* a local file is opened once (no link followed), mapped, and the mapping hashed; the rank then
  decodes from that mapping, which a later rename over the name cannot touch. Only an account
  that may write the file itself could change the mapped bytes, so a file that another account
  could write (group or others may write it, or another account owns it) is copied into the
  rank's memory and the copy hashed instead;
* a remote file (an object store) is read whole into memory and hashed there.

A file is hashed on its first opening in a process; when it is opened again (the loader keeps
a few files open at a time, and each pass reopens them) and it is still the same file (device,
inode, size, and modification and change times; the change time moves with every write and
cannot be set back without root), it is not hashed again. A remote file is hashed at each
opening.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from collections.abc import Mapping
from hashlib import sha256
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sparktrain.errors import ConfigurationError

# What identifies a local file that was hashed: (device, inode, size, mtime ns, ctime ns).
Identity = tuple[int, int, int, int, int]


def changed(url: str, name: str, why: str) -> ConfigurationError:
    """The error for a part file of the cache at ``url`` that is not the one written."""
    return ConfigurationError(
        f"the data cache {url} was changed after it was written: {name}: {why}. Another "
        f"account or process that can write there may have swapped it, so it is not used. "
        f"Delete {url} to have it written again, and keep the cache where only you can write "
        f"(cache_dir= or spark.sparktrain.data.cacheDir; the default is your private folder)"
    )


class _Held:
    """What a verified file's readers hold: closing lets go of the bytes (a mapping is
    unmapped once the last table decoded from it is gone)."""

    def __init__(self, data: Any) -> None:
        self.data: Any = data

    def close(self) -> None:
        self.data = None


class VerifiedFiles:
    """Opens part files of one cache, each checked against its record as it is read.

    Args:
        url: the cache's URL, for errors.
        digests: ``{file name: [size, SHA-256 hex]}`` as recorded when the files were written.
    """

    def __init__(self, url: str, digests: Mapping[str, Any]) -> None:
        self.url = url
        self.digests = digests
        self._checked: dict[str, Identity] = {}
        self._lock = threading.Lock()

    def open(self, path: str, name: str, local: bool, fs: Any) -> tuple[pq.ParquetFile, Any]:
        """Open ``name`` (at ``path`` on ``fs``) for reading; the Parquet file and a handle to
        close.

        Raises:
            ConfigurationError: the file is not in the record, is not a regular file, or its
                size or SHA-256 is not the recorded one; naming the file.
        """
        expected = self.digests.get(name)
        if not isinstance(expected, (list, tuple)) or len(expected) != 2:
            raise changed(self.url, name, "it is not in the manifest's record of what was written")
        size, sha = int(expected[0]), str(expected[1])
        data = self._local(path, name, size, sha) if local else self._remote(fs, path, name, size)
        if not local and sha256(data).hexdigest() != sha:
            raise changed(self.url, name, _DIFFERS)
        held = _Held(data)
        return pq.ParquetFile(pa.BufferReader(pa.py_buffer(data))), held

    def _local(self, path: str, name: str, size: int, sha: str) -> Any:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise changed(self.url, name, f"it cannot be opened ({exc.strerror})") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise changed(self.url, name, "it is no longer a regular file")
            if info.st_size != size:
                raise changed(
                    self.url, name, f"it has {info.st_size} bytes, and {size} were written"
                )
            mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
        finally:
            os.close(fd)
        if info.st_mode & 0o022 or info.st_uid not in (os.getuid(), 0):
            # Another account may write the file in place, and so the mapped bytes: decode a
            # copy of them, hashed once copied.
            data: Any = bytes(mapping)
            if sha256(data).hexdigest() != sha:
                raise changed(self.url, name, _DIFFERS)
            return data
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        with self._lock:
            known = self._checked.get(name) == identity
        if not known:
            if sha256(mapping).hexdigest() != sha:
                raise changed(self.url, name, _DIFFERS)
            with self._lock:
                self._checked[name] = identity
        return mapping

    def _remote(self, fs: Any, path: str, name: str, size: int) -> bytes:
        try:
            data = fs.cat_file(path)
        except FileNotFoundError as exc:
            raise changed(self.url, name, "it is gone") from exc
        if len(data) != size:
            raise changed(self.url, name, f"it has {len(data)} bytes, and {size} were written")
        return bytes(data)


_DIFFERS = "its SHA-256 differs from the one recorded when written (found as a rank read it)"
