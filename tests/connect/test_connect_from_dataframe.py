"""A Connect DataFrame streamed to the ranks: the stage runs over its partitions from the
client (np > 0), or the client reads it for ranks on this machine (np < 0)."""

from __future__ import annotations

from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.data import from_dataframe
from tests.fixtures import frame_trainers

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("np", [2, -2])
def test_a_connect_dataframe_reaches_every_rank_once(connect: Any, np: int) -> None:
    frame = connect.range(200).selectExpr("id", "array(CAST(id AS FLOAT), 0.5F) AS pair")
    data = from_dataframe(frame, batch_size=10, columns=["id", "pair"])
    results = SparkRunner(np=np, spark=connect).run_all(frame_trainers.read_ids, data)
    shares = [r["epochs"][0] for r in results]
    assert sorted(shares[0] + shares[1]) == list(range(200)) and all(shares)
    assert results[0]["shapes"] == {"id": [10], "pair": [10, 2]}
