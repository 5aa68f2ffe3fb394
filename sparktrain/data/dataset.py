"""The converted dataset: plain, picklable data that every rank uses to load its shard.

Driver and worker side: pyarrow and fsspec only, never pyspark (a converter travels into
``SparkRunner.run(fn, converter=c)`` and is unpickled in the training processes).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from sparktrain.data.columns import FLOAT_DTYPES, ColumnKind, column_kind, null_error
from sparktrain.data.verified import VerifiedFiles
from sparktrain.errors import ConfigurationError
from sparktrain.worker import shared_paths

if TYPE_CHECKING:
    from sparktrain.data.loader import TorchDataLoader

MANIFEST_NAME = "_sparktrain_manifest.json"
MANIFEST_VERSION = 2  # 2: with the part files' sizes and SHA-256 (data/integrity.py)
# Where the manifest keeps them (integrity.KEY, which imports this module).
_DIGESTS_KEY = "integrity"


def normalize_url(url: str) -> str:
    """An fsspec URL for ``url``: plain paths become absolute ``file://`` URLs.

    ``dbfs:/x`` (Databricks) becomes ``file:///dbfs/x``, where the workers see it.
    """
    if url.startswith("dbfs:/"):
        return "file:///dbfs/" + url[len("dbfs:/") :].lstrip("/")
    if "://" not in url:
        return "file://" + os.path.abspath(os.path.expanduser(url))
    return url.rstrip("/") if not url.endswith(":///") else url


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path inside it."""
    import fsspec.core

    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot open {url} with fsspec ({type(exc).__name__}: {exc}); install the fsspec "
            f"implementation of this scheme (s3fs for s3:// and s3a://, gcsfs for gs://, adlfs "
            f"for abfs://) or use a URL that fsspec knows"
        ) from exc
    return fs, path


def is_local(fs: Any) -> bool:
    """Whether an fsspec filesystem is the local one (read natively by pyarrow, faster)."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def _read_footers(fs: Any, paths: Sequence[str]) -> list[pq.FileMetaData]:
    def read(path: str) -> pq.FileMetaData:
        if is_local(fs):
            return pq.read_metadata(path)
        with fs.open(path, "rb") as handle:
            return pq.read_metadata(handle)

    if len(paths) <= 1 or is_local(fs):
        return [read(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        return list(pool.map(read, paths))


def _null_counts(schema: pa.Schema, footers: Iterable[pq.FileMetaData]) -> dict[str, int]:
    """Nulls per top-level scalar column from the footers' statistics (where written)."""
    counts: collections.Counter[str] = collections.Counter()
    scalars = {f.name for f in schema if not pa.types.is_nested(f.type)}
    for footer in footers:
        for group in range(footer.num_row_groups):
            row_group = footer.row_group(group)
            for index in range(row_group.num_columns):
                chunk = row_group.column(index)
                stats = chunk.statistics
                if chunk.path_in_schema in scalars and stats is not None and stats.has_null_count:
                    counts[chunk.path_in_schema] += stats.null_count
    return {name: count for name, count in counts.items() if count}


@dataclasses.dataclass(frozen=True, eq=False)
class SparkDatasetConverter:
    """A DataFrame materialized as Parquet, from which each rank loads its shard.

    Made by :func:`sparktrain.data.make_spark_converter` (from a Spark DataFrame) or
    :meth:`from_parquet` (from existing Parquet files). It is plain data (URL, file names,
    row counts, schema), so it pickles into ``SparkRunner.run(fn, converter=c)``.

    Attributes:
        url: fsspec URL of the dataset directory.
        files: Parquet file names, relative to ``url``.
        pieces: ``(file index, row group, rows)`` of every non-empty row group.
        schema: the Arrow schema of the files.
        null_counts: nulls per scalar column, where the files' statistics tell.
        dtype: float dtype of floating-point columns and vectors in batches (``None``: keep).
        storage_options: fsspec options (e.g. credentials) for reading ``url``.
        shared: a local ``url`` is one file system mounted on every host (NFS, ``/dbfs``):
            see :meth:`make_torch_dataloader`.
        digests: ``{file name: [size, SHA-256 hex]}`` recorded when a cache's files were
            written (``make_spark_converter``); each file is then checked against it as it is
            read (see :mod:`sparktrain.data.verified`). None for files of your own
            (``from_parquet``), which are read as they are.

    Example:
        >>> converter = make_spark_converter(df)
        >>> with converter.make_torch_dataloader(batch_size=64) as loader:
        ...     for batch in loader:
        ...         train_step(batch["features"], batch["label"])
    """

    url: str
    files: tuple[str, ...]
    pieces: tuple[tuple[int, int, int], ...]
    schema: pa.Schema
    null_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    dtype: str | None = None
    storage_options: Mapping[str, Any] | None = None
    shared: bool = False
    digests: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in FLOAT_DTYPES:
            raise ConfigurationError(
                f"dtype must be one of {', '.join(FLOAT_DTYPES)} or None; got {self.dtype!r}"
            )

    def __len__(self) -> int:
        return sum(rows for _, _, rows in self.pieces)

    @property
    def dataset_size(self) -> int:
        """Number of rows (petastorm's name for ``len(converter)``)."""
        return len(self)

    @property
    def file_urls(self) -> list[str]:
        """Full URLs of the Parquet files."""
        return [posixpath.join(self.url, name) for name in self.files]

    @property
    def columns(self) -> list[str]:
        """Column names, in schema order."""
        return list(self.schema.names)

    def column_kinds(self, columns: Sequence[str] | None = None) -> dict[str, ColumnKind]:
        """The kind of each requested column (all by default), checking names and types.

        Raises:
            ConfigurationError: an unknown column, an unsupported type, or known nulls in a
                feature column.
        """
        names = list(self.schema.names) if columns is None else list(columns)
        if isinstance(columns, str) or not names:
            raise ConfigurationError(
                f"columns must be a non-empty list of column names; got {columns!r}"
            )
        unknown = [name for name in names if name not in self.schema.names]
        if unknown:
            raise ConfigurationError(
                f"unknown column(s) {unknown}; the dataset has {list(self.schema.names)}"
            )
        kinds = {name: column_kind(self.schema.field(name)) for name in names}
        for name, kind in kinds.items():
            if kind is not ColumnKind.BINARY and self.null_counts.get(name):
                raise null_error(name, f"{self.null_counts[name]} null value(s)")
        return kinds

    def make_torch_dataloader(self, batch_size: int = 32, **options: Any) -> TorchDataLoader:
        """A loader of this rank's shard, as a context manager yielding dicts of tensors.

        Every shard yields the same number of batches per epoch, and every row is read once
        per epoch across the shards, except: with ``drop_last=False`` the shards are padded
        to equal size by reading the first ``shard_count - 1`` rows (at most) of the epoch's
        order a second time, and the last batch may be short (equally on every shard); with
        ``drop_last=True`` fewer than ``shard_count * batch_size`` rows of the epoch are left
        out so that every batch is full. See :mod:`sparktrain.data.sharding`.

        Args:
            batch_size: rows per batch.
            **options: the keyword arguments below, all optional (a name that is not one of
                them is a TypeError).

        Keyword Args:
            num_epochs (int | None): epochs per pass over the loader; ``None`` repeats forever.
            shuffle (bool): shuffle rows, differently every epoch.
            seed (int | None): seed of the shuffle; give every rank the same one.
            cur_shard (int): this rank's shard (default: ``sparktrain.worker.context.rank()``).
            shard_count (int): number of shards (default: ``world_size()``).
            columns (list[str] | None): columns to load (default: all).
            transform (Callable | None): function applied to each batch dict (in the batch thread when
                ``prefetch`` > 0, else in the caller's thread).
            drop_last (bool): drop rows so every batch is full, instead of padding shards.
            read_ahead (bool): read the next window of row groups in a background thread while
                batches are cut from the current one (default True; False reads in the
                thread that makes batches).
            prefetch (int): batches made ahead in a second background thread, which also runs
                ``transform`` (default 0: batches are made in the caller's thread). Worth
                trying when ``transform`` is heavy, releases the GIL (torch ops) and a core
                is free; otherwise it only adds a hand-over between threads per batch.
            shuffle_window (int): row groups whose rows are mixed together when shuffling. The
                loader holds up to about three windows at once (one being read, one queued,
                one being cut into batches), so its memory is about
                ``3 * shuffle_window * row group size``; lower it to save memory.

        Returns:
            A :class:`~sparktrain.data.loader.TorchDataLoader`.

        Raises:
            ConfigurationError: an invalid argument, column or column type; or a local
                ``url`` while the ranks run on more than one host, unless the converter was
                made with ``shared=True`` and every host sees the directory rank 0 sees
                (checked once per run: see :mod:`sparktrain.worker.shared_paths`).

        Example:
            >>> with converter.make_torch_dataloader(64, num_epochs=None) as loader:
            ...     batches = iter(loader)
            ...     for step in range(steps_per_epoch):
            ...         batch = next(batches)
        """
        # Imported here so that the driver can make converters without importing torch.
        from sparktrain.data.loader import TorchDataLoader

        self.check_shared()
        return TorchDataLoader(self, batch_size, **options)

    def check_shared(self) -> None:
        """Refuse a local ``url`` that this run's hosts do not share (see
        :meth:`make_torch_dataloader`); a remote URL, or one host, always passes."""
        fs, root = filesystem(self.url, self.storage_options)
        shared_paths.check_shared(
            "data cache directory",
            self.url,
            root if is_local(fs) else None,
            self.shared,
            "make the converter with shared=True (make_spark_converter(df, shared=True) or "
            "SparkDatasetConverter.from_parquet(url, shared=True))",
        )

    def delete(self) -> None:
        """Delete the materialized files; the converter cannot load afterwards."""
        fs, root = filesystem(self.url, self.storage_options)
        if fs.exists(root):
            fs.rm(root, recursive=True)

    def open_file(self, index: int) -> tuple[pq.ParquetFile, Any]:
        """Open file ``index`` for reading; returns the Parquet file and a handle to close.

        Raises:
            ConfigurationError: the file is not the one recorded when it was written (a
                cache's file swapped or changed), naming it.
        """
        fs, root = filesystem(self.url, self.storage_options)
        path = posixpath.join(root, self.files[index])
        if self.digests is not None:
            return self._verified().open(path, self.files[index], is_local(fs), fs)
        if is_local(fs):
            # Mapped, Arrow decodes column chunks straight from the page cache instead of
            # first copying each one into a freshly allocated buffer.
            parquet = pq.ParquetFile(path, memory_map=True)
            return parquet, parquet
        handle = fs.open(path, "rb")
        return pq.ParquetFile(handle), handle

    def _verified(self) -> VerifiedFiles:
        """This process's checker of the files (it remembers which it has hashed)."""
        checker = self.__dict__.get("_checker")
        if checker is None:
            checker = VerifiedFiles(self.url, self.digests or {})
            object.__setattr__(self, "_checker", checker)
        return checker

    def __getstate__(self) -> dict[str, Any]:
        # What one process has hashed says nothing about the files another one will open.
        return {k: v for k, v in self.__dict__.items() if k != "_checker"}

    @classmethod
    def from_parquet(
        cls,
        url: str,
        *,
        files: Sequence[str] | None = None,
        dtype: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        shared: bool = False,
    ) -> SparkDatasetConverter:
        """A converter over existing Parquet files, without Spark.

        Args:
            url: a directory (every ``*.parquet`` file under it, in name order) or one file.
            files: file names relative to ``url`` to use instead of listing the directory.
            dtype: float dtype for floating-point columns and vectors (``None``: keep).
            storage_options: fsspec options for ``url``.
            shared: a local ``url`` is mounted on every host (see
                :meth:`make_torch_dataloader`).

        Raises:
            ConfigurationError: no Parquet files, or files whose schemas differ.
        """
        url = normalize_url(url)
        fs, root = filesystem(url, storage_options)
        if files is None:
            if fs.isfile(root):
                files = [posixpath.basename(root)]
                root, url = posixpath.dirname(root), url.rsplit("/", 1)[0]
            else:
                files = _list_parquet(fs, root)
        names = tuple(files)
        if not names:
            raise ConfigurationError(f"no Parquet files (*.parquet) under {url}")
        footers = _read_footers(fs, [posixpath.join(root, name) for name in names])
        schema = footers[0].schema.to_arrow_schema()
        for name, footer in zip(names, footers, strict=True):
            if not footer.schema.to_arrow_schema().equals(schema, check_metadata=False):
                raise ConfigurationError(
                    f"Parquet file {name} under {url} has a different schema than {names[0]}; "
                    f"all files of a dataset need one schema"
                )
        pieces = tuple(
            (index, group, footer.row_group(group).num_rows)
            for index, footer in enumerate(footers)
            for group in range(footer.num_row_groups)
            if footer.row_group(group).num_rows > 0
        )
        return cls(
            url=url,
            files=names,
            pieces=pieces,
            schema=schema.remove_metadata(),
            null_counts=_null_counts(schema, footers),
            dtype=dtype,
            storage_options=storage_options,
            shared=shared,
        )

    def to_manifest(self) -> dict[str, Any]:
        """JSON-safe description, stored next to the files so a cache can be reused."""
        return {
            "version": MANIFEST_VERSION,
            "files": list(self.files),
            "pieces": [list(piece) for piece in self.pieces],
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii"),
            "null_counts": dict(self.null_counts),
            "dtype": self.dtype,
            **({} if self.digests is None else {_DIGESTS_KEY: dict(self.digests)}),
        }

    @classmethod
    def from_manifest(
        cls,
        url: str,
        manifest: Mapping[str, Any],
        storage_options: Mapping[str, Any] | None = None,
    ) -> SparkDatasetConverter | None:
        """Rebuild a converter from :meth:`to_manifest` output; ``None`` if it is unusable."""
        if manifest.get("version") != MANIFEST_VERSION:
            return None
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["schema"])))
        return cls(
            url=url,
            files=tuple(manifest["files"]),
            pieces=tuple((int(f), int(g), int(n)) for f, g, n in manifest["pieces"]),
            schema=schema,
            null_counts={str(k): int(v) for k, v in manifest["null_counts"].items()},
            dtype=manifest["dtype"],
            storage_options=storage_options,
            # Absent for files sparktrain did not write (from_parquet): nothing to check them
            # against. A reused cache's manifest without them is refused before this is used.
            digests=manifest.get(_DIGESTS_KEY),
        )


def _list_parquet(fs: Any, root: str) -> list[str]:
    """Names (relative to ``root``) of the data files under it, skipping ``_`` / ``.`` files."""
    found = []
    for path in fs.find(root):
        relative = posixpath.relpath(path, root)
        parts = relative.split("/")
        if relative.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in parts):
            found.append(relative)
    return sorted(found)
