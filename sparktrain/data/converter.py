"""Driver side: materialize a Spark DataFrame once as Parquet and describe it for the ranks.

pyspark is imported inside functions only, so importing this module never needs Spark.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from sparktrain import private_dir
from sparktrain.data import integrity
from sparktrain.data.columns import unsupported_type_error
from sparktrain.data.dataset import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    SparkDatasetConverter,
    filesystem,
    normalize_url,
)
from sparktrain.data.task_writer import WRITERS, spark_lacks_filesystem, write_from_tasks
from sparktrain.errors import ConfigurationError
from sparktrain.log import get_logger
from sparktrain.shipping.python_probe import sparktrain_python

_log = get_logger(__name__)

CACHE_DIR_CONF = "spark.sparktrain.data.cacheDir"
CACHE_FOLDER = "cache"  # in the user's private folder, see default_cache_dir
DEFAULT_ROW_GROUP_SIZE_BYTES = 32 << 20
SPARK_DTYPES = ("float32", "float64")
_PROBE_PREFIX = "_sparktrain_probe_"


def make_spark_converter(
    df: Any,
    *,
    cache_dir: str | None = None,
    row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    dtype: str | None = "float32",
    storage_options: Mapping[str, Any] | None = None,
    shared: bool = False,
    writer: str = "auto",
) -> SparkDatasetConverter:
    """Materialize ``df`` as Parquet under the cache directory, once per query plan.

    Calling it again with the same DataFrame (same analyzed plan and schema) and options
    reuses the files. Floating-point columns and arrays are cast to ``dtype`` before writing;
    ML vectors are kept as Spark writes them and densified to ``dtype`` when loaded.

    Args:
        df: a Spark DataFrame whose columns are numbers, arrays of numbers, ML vectors,
            binary or strings.
        cache_dir: where to write, any URL that fsspec reads (``hdfs://``, ``s3a://``,
            ``abfss://``, ``dbfs:/``, ``file://`` on a shared mount); Spark or its tasks
            write it, see ``writer``. Default: the Spark conf
            ``spark.sparktrain.data.cacheDir``, else :func:`default_cache_dir` (fine when the
            driver and executors share one machine and account). Plain paths are local. A
            cache is reused only when its files are the ones written (sizes and SHA-256 in
            its manifest); one that was changed is refused with an error naming the file.
        row_group_size_bytes: Parquet row group size; the loader reads one row group at a
            time, so this bounds its memory per row group.
        dtype: ``"float32"`` (default), ``"float64"``, or ``None`` to keep float types.
        storage_options: fsspec options (e.g. credentials) for reading ``cache_dir`` on the
            driver and the ranks; Spark itself writes with its Hadoop configuration.
        shared: a local ``cache_dir`` is one file system mounted on every host (NFS,
            ``/dbfs``). Without it, the ranks refuse a local cache when they run on more
            than one host; with it, they check that every host sees the directory rank 0
            sees (see :meth:`SparkDatasetConverter.make_torch_dataloader`).
        writer: who writes the files. ``"spark"``: Spark's Parquet writer, through its
            Hadoop file systems. ``"tasks"``: each Spark task writes its partition with
            pyarrow through fsspec and ``storage_options``, for stores Spark's Hadoop cannot
            write (``s3a://`` without the S3A jars, ``gs://`` without the GCS connector).
            ``"auto"`` (default): Spark's writer, and the tasks' where Spark has no file
            system for the URL's scheme.

    Returns:
        A picklable :class:`SparkDatasetConverter`.

    Raises:
        ConfigurationError: an unsupported column type, an empty DataFrame, a cache directory
            the executors cannot read, a cached file changed since it was written, or an
            invalid argument.

    Example:
        >>> converter = make_spark_converter(df.select("features", "label"))
        >>> SparkRunner(np=2).run(train, converter=converter)
        >>> converter.delete()
    """
    if (
        isinstance(row_group_size_bytes, bool)
        or not isinstance(row_group_size_bytes, int)
        or row_group_size_bytes <= 0
    ):
        raise ConfigurationError(
            f"row_group_size_bytes must be a positive int; got {row_group_size_bytes!r}"
        )
    if writer not in WRITERS:
        raise ConfigurationError(f"writer must be one of {', '.join(WRITERS)}; got {writer!r}")
    if dtype is not None and dtype not in SPARK_DTYPES:
        raise ConfigurationError(
            f"dtype must be one of {', '.join(SPARK_DTYPES)} or None; got {dtype!r}"
        )
    _check_spark_types(df.schema)
    spark = df.sparkSession
    base = cache_dir or spark.conf.get(CACHE_DIR_CONF, None) or default_cache_dir()
    base = base.rstrip("/") if "://" in base or base.startswith("dbfs:") else normalize_url(base)
    # The key comes from the plan the caller gave: casting makes new expression ids each time.
    key = _cache_key(df, f"{row_group_size_bytes}/{dtype}")
    df = _cast_floats(df, dtype)
    spark_url = f"{base}/{key}"
    url = normalize_url(spark_url)
    fs, root = filesystem(url, storage_options)

    cached = _load_manifest(fs, root, url, storage_options)
    if cached is not None:
        return dataclasses.replace(cached, shared=shared)
    _check_executor_access(spark, normalize_url(base), storage_options)
    files, digests = _write(df, spark_url, writer, row_group_size_bytes, storage_options)
    if files == []:
        fs.rm(root, recursive=True)
        raise _empty_error()
    converter = SparkDatasetConverter.from_parquet(
        url, files=files, dtype=dtype, storage_options=storage_options, shared=shared
    )
    if len(converter) == 0:
        converter.delete()
        raise _empty_error()
    if converter.null_counts:
        warnings.warn(
            f"columns with nulls: {dict(converter.null_counts)}; make_torch_dataloader refuses "
            f"them: fill or drop those rows before converting, or leave the columns out with "
            f"columns=[...]",
            UserWarning,
            stacklevel=2,
        )
    if digests is None:  # Spark wrote them: read back once, right after the job
        digests = integrity.record(fs, root, converter.files)
    manifest = {**converter.to_manifest(), integrity.KEY: digests}
    fs.pipe(posixpath.join(root, MANIFEST_NAME), json.dumps(manifest).encode())
    # The ranks check each file against the record as they read it.
    return dataclasses.replace(converter, digests=digests)


def default_cache_dir() -> str:
    """``file://<private folder>/cache``: the user's own (see :mod:`sparktrain.private_dir`).

    Raises:
        NotPrivateError: the private folder is not this user's alone.
    """
    return f"file://{private_dir.usable_folder(CACHE_FOLDER)}"


def _write(
    df: Any,
    url: str,
    writer: str,
    row_group_size_bytes: int,
    storage_options: Mapping[str, Any] | None,
) -> tuple[list[str] | None, integrity.Digests | None]:
    """Write ``df`` under ``url``; the file names and their digests when the tasks wrote them,
    None when Spark did (the directory is then listed and read back)."""
    if writer != "tasks":
        try:
            (
                df.write.mode("overwrite")
                .option("parquet.block.size", str(row_group_size_bytes))
                .parquet(url)
            )
            return None, None
        except Exception as exc:
            if not spark_lacks_filesystem(exc):
                raise
            if writer == "spark":
                raise ConfigurationError(
                    f"Spark has no file system for {url} (its Hadoop configuration lacks the "
                    f"scheme's jars); pass writer='tasks' (or 'auto') to write the cache "
                    f"from the Spark tasks through fsspec, or add the connector to Spark"
                ) from exc
            _log.info("Spark cannot write %s; the Spark tasks write it through fsspec", url)
    names, digests = write_from_tasks(
        df,
        normalize_url(url),
        row_group_size_bytes=row_group_size_bytes,
        storage_options=storage_options,
    )
    return names, digests


def _empty_error() -> ConfigurationError:
    return ConfigurationError(
        "the DataFrame is empty (0 rows), so there is nothing to train on; check the "
        "filters or joins that produce it"
    )


def _is_vector_udt(data_type: Any) -> bool:
    from pyspark.sql.types import UserDefinedType

    return isinstance(data_type, UserDefinedType) and type(data_type).__name__ == "VectorUDT"


def _check_spark_types(schema: Any) -> None:
    """Raise for the first column whose Spark type the loader cannot turn into a tensor."""
    from pyspark.sql import types

    numbers = (
        types.BooleanType,
        types.ByteType,
        types.ShortType,
        types.IntegerType,
        types.LongType,
        types.FloatType,
        types.DoubleType,
    )
    for field in schema.fields:
        data_type = field.dataType
        if (
            isinstance(data_type, numbers + (types.BinaryType, types.StringType))
            or (
                isinstance(data_type, types.ArrayType)
                and isinstance(data_type.elementType, numbers)
            )
            or _is_vector_udt(data_type)
        ):
            continue
        raise unsupported_type_error(field.name, data_type.simpleString())


def _cast_floats(df: Any, dtype: str | None) -> Any:
    """``df`` with float and double columns (and arrays of them) cast to ``dtype``."""
    if dtype is None:
        return df
    from pyspark.sql import types

    target: Any = types.FloatType() if dtype == "float32" else types.DoubleType()
    floats = (types.FloatType, types.DoubleType)
    columns = []
    changed = False
    for field in df.schema.fields:
        # The DataFrame's own column, not functions.col: that one picks classic or Connect by
        # a process-wide flag, which a Connect session made without builder.remote() lacks.
        column = df[_quote(field.name)]
        data_type = field.dataType
        if isinstance(data_type, floats) and type(data_type) is not type(target):
            column, changed = column.cast(target).alias(field.name), True
        elif (
            isinstance(data_type, types.ArrayType)
            and isinstance(data_type.elementType, floats)
            and type(data_type.elementType) is not type(target)
        ):
            column = column.cast(types.ArrayType(target, data_type.containsNull))
            column, changed = column.alias(field.name), True
        columns.append(column)
    return df.select(*columns) if changed else df


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _cache_key(df: Any, options: str) -> str:
    """A directory name unique to the DataFrame's analyzed plan, schema and write options.

    Plans are compared by their full text (no field truncation), which holds the input
    paths but not the input files' contents: a cache outlives changes to the files a plan
    reads. Where the plan is not reachable (Spark Connect) every call gets a fresh key.
    """
    try:
        plan = df._jdf.queryExecution().analyzed()
    except AttributeError:
        return "df-" + uuid.uuid4().hex
    text = _full_tree_string(plan)
    digest = hashlib.sha256()
    for part in (f"v{MANIFEST_VERSION}", text, df.schema.json(), options):
        digest.update(part.encode())
        digest.update(b"\0")
    return "df-" + digest.hexdigest()[:32]


def _full_tree_string(plan: Any) -> str:
    """The plan's text without truncated field lists (``toString`` cuts them at 25)."""
    every_field = 2**31 - 1
    # treeString(verbose, addSuffix, maxFields, printOperatorId[, printOutputColumns]): the
    # last argument exists from Spark 4.
    for args in ((True, False, every_field, False, False), (True, False, every_field, False)):
        try:
            return str(plan.treeString(*args))
        except Exception:  # py4j: no such overload in this Spark version
            continue
    return str(plan.toString())


def _load_manifest(
    fs: Any, root: str, url: str, storage_options: Mapping[str, Any] | None
) -> SparkDatasetConverter | None:
    """The converter recorded by an earlier materialization, if complete and still there."""
    path = posixpath.join(root, MANIFEST_NAME)
    try:
        manifest = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None
    converter = SparkDatasetConverter.from_manifest(url, manifest, storage_options)
    if converter is None or not all(
        fs.exists(posixpath.join(root, name)) for name in converter.files[:1]
    ):
        return None
    integrity.verify(fs, root, url, converter.files, manifest.get(integrity.KEY) or {})
    return converter


def _check_executor_access(spark: Any, url: str, storage_options: Mapping[str, Any] | None) -> None:
    """Write a file on the driver and read it back from executor tasks.

    Skipped when Spark runs in one JVM (``local[...]``), where the driver is the executor.

    Raises:
        ConfigurationError: the driver cannot write ``url`` or an executor cannot read it.
    """
    master = spark.conf.get("spark.master", "")
    if master == "local" or master.startswith("local["):
        return
    fs, root = filesystem(url, storage_options)
    name = _PROBE_PREFIX + uuid.uuid4().hex
    token = uuid.uuid4().hex
    path = posixpath.join(root, name)
    try:
        fs.makedirs(root, exist_ok=True)
        fs.pipe(path, token.encode())
    except Exception as exc:
        raise ConfigurationError(
            f"cannot write the data cache directory {url} from the driver ({exc}); set "
            f"{CACHE_DIR_CONF} (or cache_dir=) to a directory the driver can write"
        ) from exc
    try:
        failures = _probe_from_executors(spark, url, name, token, storage_options)
    finally:
        fs.rm(path)
    if failures:
        hosts = ", ".join(sorted({host for host, _ in failures}))
        raise ConfigurationError(
            f"the data cache directory {url} is not readable from the executors on {hosts} "
            f"({failures[0][1]}): executors cannot see files the driver writes there. A local "
            f"file:// directory only works when the driver and every executor share a machine "
            f"or a mount. Set {CACHE_DIR_CONF} (or cache_dir=) to storage that every executor "
            f"reaches: hdfs://..., s3a://..., abfss://..., dbfs:/..., or a shared NFS mount"
        )


def _probe_from_executors(
    spark: Any, url: str, name: str, token: str, storage_options: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    """``(host, error)`` of each probe task that could not read the driver's file."""
    options = dict(storage_options or {})

    # A closure, so cloudpickle ships it by value and the executors need nothing importable.
    def probe(batches: Any) -> Any:
        import posixpath
        import socket

        import fsspec.core
        import pyarrow as pa

        for _ in batches:
            try:
                fs, root = fsspec.core.url_to_fs(url, **options)
                found = fs.cat_file(posixpath.join(root, name)).decode()
                error = "" if found == token else "the file has other content"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            yield pa.RecordBatch.from_pydict({"host": [socket.gethostname()], "error": [error]})

    try:
        tasks = max(2, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        tasks = 2
    # The interpreter a run starts (checked as a run checks it), not the session's default.
    with sparktrain_python(spark, data=True):
        stage = spark.range(0, tasks, 1, tasks).mapInArrow(probe, "host string, error string")
    rows = stage.collect()
    return [(row["host"], row["error"]) for row in rows if row["error"]]
