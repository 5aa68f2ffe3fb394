"""Where checkpoint files live: a local directory (os calls, fsync) or any fsspec URL."""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from typing import IO, Any

from sparktrain.checkpoint.layout import SHARDED_SUFFIX, partial_name
from sparktrain.errors import ConfigurationError


class _Store:
    """One checkpoint directory: a local one (os calls, fsync) or an fsspec one.

    Attributes:
        where: the directory, in the form it was given (absolute for a local path).
    """

    def __init__(self, directory: str, storage_options: Mapping[str, Any] | None) -> None:
        self.fs: Any = None
        scheme = "file://" if directory.startswith("file://") else ""
        if scheme or "://" not in directory:
            self.root = os.path.abspath(directory[len(scheme) :])
            self.where = scheme + self.root
            return
        try:
            import fsspec
        except ImportError as exc:
            raise ConfigurationError(
                f"checkpoint directory {directory!r} needs fsspec: pip install fsspec "
                "(plus s3fs for s3://, gcsfs for gs://, adlfs for abfs://)"
            ) from exc
        self.fs, root = fsspec.core.url_to_fs(directory, **dict(storage_options or {}))
        self.root = root.rstrip("/")
        self.where = directory.rstrip("/")
        if type(self.fs).__name__ == "LocalFileSystem":  # e.g. local://: keep fsync and rename
            self.fs = None

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name) if self.fs is None else f"{self.root}/{name}"

    def url(self, name: str) -> str:
        """The path or URL of ``name``, in the form the directory was given."""
        return f"{self.where}/{name}"

    def sub(self, name: str) -> _Store:
        """The folder ``name`` inside this directory (a sharded checkpoint's data)."""
        inner = copy.copy(self)
        inner.root = self._path(name)
        inner.where = self.url(name)
        return inner

    def names(self) -> list[str]:
        """The entries of the directory; none when it does not exist."""
        try:
            if self.fs is None:
                return os.listdir(self.root)
            # Listings are cached per filesystem instance; a stale one would hide new markers.
            self.fs.invalidate_cache(self.root)
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def makedirs(self) -> None:
        if self.fs is None:
            os.makedirs(self.root, exist_ok=True)
        else:
            self.fs.makedirs(self.root, exist_ok=True)

    def read(self, name: str) -> bytes:
        if self.fs is None:
            with open(self._path(name), "rb") as f:
                return f.read()
        return bytes(self.fs.cat_file(self._path(name)))

    def open(self, name: str) -> IO[bytes]:
        if self.fs is None:
            return open(self._path(name), "rb")
        return self.fs.open(self._path(name), "rb")

    def exists(self, name: str) -> bool:
        if self.fs is None:
            return os.path.exists(self._path(name))
        return bool(self.fs.exists(self._path(name)))

    def size(self, name: str) -> int:
        if self.fs is None:
            return os.stat(self._path(name)).st_size
        return int(self.fs.size(self._path(name)))

    def remove(self, name: str) -> None:
        """Delete the file ``name``, or the folder ``name`` with everything in it."""
        path = self._path(name)
        try:
            if self.fs is None:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
            elif name.endswith(SHARDED_SUFFIX) and self.fs.isdir(path):
                self.fs.rm(path, recursive=True)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def write(self, name: str, fill: Callable[[IO[bytes]], object]) -> None:
        """Create ``name`` with what ``fill`` writes; it appears whole or not at all.

        Locally the bytes go to a hidden ``.partial`` file that is fsynced, then renamed, and
        the directory is fsynced. On an object store the upload becomes visible only when
        it completes; a killed upload leaves nothing under ``name``.
        """
        if self.fs is not None:
            try:
                with self.fs.open(self._path(name), "wb") as f:
                    fill(f)
            except BaseException:
                self.remove(name)
                raise
            return
        tmp = partial_name(name, uuid.uuid4().hex[:8])
        try:
            with open(self._path(tmp), "xb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(self._path(tmp), self._path(name))
        except BaseException:
            self.remove(tmp)
            raise
        if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class _HashingWriter:
    """A write-only file that counts and hashes what passes through to ``target``."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        n = memoryview(data).nbytes
        self.sha256.update(data)
        self.size += n
        self.target.write(data)
        return n

    def flush(self) -> None:
        self.target.flush()
