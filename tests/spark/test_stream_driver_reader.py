"""The driver's reader for np < 0 on a real session: a DataFrame's rows, ML vectors included,
reach a rank through the stream as the column rules say, and a DataFrame that fails in Spark
stops the feed and the rank with Spark's own message."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from sparktrain.data.stream import Feeder, RankStream, StreamError, dataframe_batches

pytestmark = pytest.mark.spark

KEY = b"d" * 32
CTX = multiprocessing.get_context("fork")


def rank(address: str, out: Any, spill_dir: str) -> None:
    try:
        with RankStream(address, 0, 7, key=KEY, local_dir=spill_dir) as loader:
            batches = [b for _ in range(2) for b in loader]
        out.put(
            (
                "ok",
                [i for b in batches for i in b["id"].tolist()],
                [list(b["vec"].shape) for b in batches][:1],
                [r for b in batches for r in b["raw"]][:2],
            )
        )
    except StreamError as exc:
        out.put(("error", str(exc), None, None))


def test_a_dataframe_reaches_a_rank_through_the_stream(spark: Any, tmp_path: Path) -> None:
    from pyspark.ml.linalg import Vectors

    rows = [
        (i, Vectors.dense([float(i)] * 3) if i % 2 else Vectors.sparse(3, {i % 3: 1.0}), bytes([i]))
        for i in range(20)
    ]
    df = spark.createDataFrame(rows, ["id", "vec", "raw"]).repartition(3)
    out = CTX.Queue()
    with Feeder(1, KEY, parent=tmp_path) as feeder:
        process = CTX.Process(target=rank, args=(feeder.address, out, str(tmp_path)))
        process.start()
        stats = feeder.feed(dataframe_batches(df, rows=6))
        kind, ids, shapes, raw = out.get(timeout=120)
    process.join(60)
    assert kind == "ok", ids
    assert sorted(ids) == sorted(list(range(20)) * 2)  # two epochs, the second from the spill
    assert shapes == [[7, 3]]
    assert all(isinstance(r, bytes) for r in raw)
    assert stats.rows == [20]


def test_a_failing_dataframe_stops_the_rank_with_sparks_message(spark: Any, tmp_path: Path) -> None:
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        df = spark.createDataFrame([("1",), ("x",)], ["s"]).selectExpr("cast(s as int) as id")
        out = CTX.Queue()
        with Feeder(1, KEY, parent=tmp_path) as feeder:
            process = CTX.Process(target=rank, args=(feeder.address, out, str(tmp_path)))
            process.start()
            with pytest.raises(Exception, match="CAST_INVALID_INPUT") as caught:
                feeder.feed(dataframe_batches(df, rows=1))
            kind, message, _, _ = out.get(timeout=120)
        process.join(60)
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    assert kind == "error"
    assert "the task's input failed" in message and "CAST_INVALID_INPUT" in message
    assert not isinstance(caught.value, StreamError)
