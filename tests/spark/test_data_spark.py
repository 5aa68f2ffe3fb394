"""make_spark_converter on a real local-cluster: materialization, cache reuse, errors, pickling."""

from __future__ import annotations

import pickle
from pathlib import Path

import cloudpickle
import pytest

from sparktrain.data import SparkDatasetConverter, make_spark_converter
from sparktrain.errors import ConfigurationError

pytestmark = pytest.mark.spark


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return f"file://{tmp_path}/cache"


@pytest.fixture
def vectors_df(spark):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types

    rows = []
    for i in range(40):
        vector = Vectors.dense([float(i)] * 3) if i % 2 else Vectors.sparse(3, {i % 3: float(i)})
        rows.append((i, float(i) / 2, [float(i), 1.0], vector, bytes([i])))
    schema = types.StructType(
        [
            types.StructField("id", types.LongType()),
            types.StructField("x", types.DoubleType()),
            types.StructField("arr", types.ArrayType(types.DoubleType())),
            types.StructField("vec", VectorUDT()),
            types.StructField("raw", types.BinaryType()),
        ]
    )
    return spark.createDataFrame(rows, schema)


def _read(converter: SparkDatasetConverter, shard: int, shards: int) -> list[dict]:
    with converter.make_torch_dataloader(8, cur_shard=shard, shard_count=shards) as loader:
        return list(loader)


@pytest.mark.parametrize("writer", ["spark", "tasks"])
def test_converts_dataframe_with_ml_vectors(vectors_df, cache_dir, writer):
    converter = make_spark_converter(vectors_df, cache_dir=cache_dir, writer=writer)
    assert len(converter) == 40
    assert converter.columns == ["id", "x", "arr", "vec", "raw"]
    assert str(converter.schema.field("x").type) == "float"  # cast to dtype="float32"
    batches = _read(converter, 0, 1)
    assert len(batches) == 5
    by_id = {}
    for batch in batches:
        assert batch["vec"].shape[1] == 3 and str(batch["vec"].dtype) == "torch.float32"
        assert batch["arr"].shape[1] == 2 and str(batch["arr"].dtype) == "torch.float32"
        for row, ident in enumerate(batch["id"].tolist()):
            by_id[ident] = (batch["x"][row].item(), batch["vec"][row].tolist(), batch["raw"][row])
    assert sorted(by_id) == list(range(40))
    assert by_id[7] == (3.5, [7.0, 7.0, 7.0], b"\x07")
    assert by_id[4] == (2.0, [0.0, 4.0, 0.0], b"\x04")  # sparse, densified


def test_cache_is_reused_for_the_same_plan_and_deleted(spark, cache_dir):
    df = spark.range(100).selectExpr("id", "cast(id as double) * 2 as y")
    first = make_spark_converter(df, cache_dir=cache_dir)
    files = sorted(Path(first.url[len("file://") :]).glob("*.parquet"))
    stamps = [f.stat().st_mtime_ns for f in files]
    again = make_spark_converter(df, cache_dir=cache_dir)
    assert again.url == first.url and again.pieces == first.pieces
    assert [f.stat().st_mtime_ns for f in files] == stamps  # not written again
    other = make_spark_converter(df.filter("id < 50"), cache_dir=cache_dir)
    assert other.url != first.url and len(other) == 50
    first.delete()
    assert not Path(first.url[len("file://") :]).exists()
    remade = make_spark_converter(df, cache_dir=cache_dir)
    assert remade.url == first.url and len(remade) == 100
    remade.delete()
    other.delete()


def test_plans_that_differ_past_the_25th_field_get_their_own_cache(spark, cache_dir):
    # Plan.toString() elides fields after the 25th; the key must still tell these apart.
    def wide(last: int):
        return spark.range(4).selectExpr(*[f"id + {i} as c{i}" for i in range(29)], f"{last} as z")

    one = make_spark_converter(wide(1), cache_dir=cache_dir)
    two = make_spark_converter(wide(2), cache_dir=cache_dir)
    assert one.url != two.url
    one.delete()
    two.delete()


def test_cache_dir_comes_from_spark_conf(spark, cache_dir):
    spark.conf.set("spark.sparktrain.data.cacheDir", cache_dir)
    try:
        converter = make_spark_converter(spark.range(5))
    finally:
        spark.conf.unset("spark.sparktrain.data.cacheDir")
    assert converter.url.startswith(cache_dir + "/")
    converter.delete()


@pytest.mark.parametrize("writer", ["spark", "tasks"])
def test_empty_dataframe_is_refused(spark, cache_dir, tmp_path, writer):
    with pytest.raises(ConfigurationError, match="DataFrame is empty"):
        make_spark_converter(spark.range(10).filter("id < 0"), cache_dir=cache_dir, writer=writer)
    assert not list((tmp_path / "cache").glob("df-*"))


def test_tasks_write_one_file_per_partition_in_row_groups_of_the_given_size(spark, tmp_path):
    import pyarrow.parquet as pq

    df = spark.range(0, 4000, 1, 3).selectExpr("id", "CAST(id AS DOUBLE) / 2 AS x")
    converter = make_spark_converter(
        df, cache_dir=str(tmp_path), writer="tasks", row_group_size_bytes=8 << 10
    )
    assert len(converter.files) == 3 and all(f.startswith("part-") for f in converter.files)
    on_disk = sorted(p.name for p in Path(converter.url[len("file://") :]).glob("*.parquet"))
    assert on_disk == sorted(converter.files)
    groups = [pq.ParquetFile(Path(converter.url[7:]) / f).num_row_groups for f in on_disk]
    assert all(count > 1 for count in groups), groups  # 1333 rows × 12 bytes > 8 KiB
    ids = sorted(i for batch in _read(converter, 0, 1) for i in batch["id"].tolist())
    assert ids == list(range(4000))
    again = make_spark_converter(
        df, cache_dir=str(tmp_path), writer="tasks", row_group_size_bytes=8 << 10
    )
    assert again.url == converter.url and again.files == converter.files  # cached
    converter.delete()


def test_a_scheme_spark_cannot_write_is_written_by_the_tasks(spark, tmp_path):
    # fsspec's local:// is the local disk under another name, which Spark's Hadoop does not
    # know: as with s3a:// on a Spark without the S3A jars, its writer fails at once.
    cache = f"local://{tmp_path}/cache"
    with pytest.raises(ConfigurationError, match=r"Spark has no file system.*writer='tasks'"):
        make_spark_converter(spark.range(20), cache_dir=cache, writer="spark")
    converter = make_spark_converter(spark.range(0, 20, 1, 2), cache_dir=cache)
    assert converter.url.startswith(cache + "/") and len(converter.files) == 2
    assert sorted(i for b in _read(converter, 0, 1) for i in b["id"].tolist()) == list(range(20))


def test_an_unknown_writer_is_refused(spark, cache_dir):
    with pytest.raises(ConfigurationError, match="writer must be one of auto, spark, tasks"):
        make_spark_converter(spark.range(3), cache_dir=cache_dir, writer="hadoop")


def test_unsupported_column_is_refused_before_writing(spark, cache_dir, tmp_path):
    df = spark.range(3).selectExpr("id", "current_timestamp() as ts")
    with pytest.raises(ConfigurationError, match=r"column 'ts' has type timestamp.*df.drop"):
        make_spark_converter(df, cache_dir=cache_dir)
    assert not (tmp_path / "cache").exists()


def test_cache_dir_executors_cannot_read_is_refused(spark):
    # memory:// lives in the driver's process only: like a file:// path on a multi-host
    # cluster, the executors cannot see what the driver writes there.
    with pytest.raises(ConfigurationError, match=r"not readable from the executors.*cacheDir"):
        make_spark_converter(spark.range(3), cache_dir="memory://sparktrain-unreachable")


def test_converter_pickles_and_loads_shards_on_executors(vectors_df, cache_dir):
    converter = make_spark_converter(vectors_df.select("id", "vec"), cache_dir=cache_dir)
    clone = pickle.loads(pickle.dumps(converter))
    assert (clone.url, clone.pieces, clone.schema) == (
        converter.url,
        converter.pieces,
        converter.schema,
    )
    assert len(cloudpickle.dumps(converter)) < 10_000

    def shard_ids(shard: int) -> tuple[int, list[int], int]:
        with clone.make_torch_dataloader(4, cur_shard=shard, shard_count=2, seed=3) as loader:
            batches = list(loader)
        return shard, [i for b in batches for i in b["id"].tolist()], len(batches)

    sc = vectors_df.sparkSession.sparkContext
    results = sc.parallelize([0, 1], 2).map(shard_ids).collect()
    assert len({count for _, _, count in results}) == 1
    ids = sorted(i for _, shard, _ in results for i in shard)
    assert ids == list(range(40))
    converter.delete()
