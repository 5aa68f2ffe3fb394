"""make_spark_converter on a Connect DataFrame feeds DDP ranks started from that session."""

from __future__ import annotations

import numpy as np
import pytest

from sparktrain import SparkRunner
from sparktrain.data import make_spark_converter

pytestmark = pytest.mark.spark


def count_rows(converter, batch_size):
    """Every rank reads its shard once; returns each rank's rows and label sum."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rows, labels = 0, 0
    with converter.make_torch_dataloader(batch_size, num_epochs=1) as loader:
        for batch in loader:
            assert batch["features"].shape[1] == 64
            rows += int(batch["label"].shape[0])
            labels += int(batch["label"].sum())
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, (rows, labels))
    dist.destroy_process_group()
    return found


def test_converter_from_connect_dataframe_feeds_the_ranks(connect, tmp_path):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data[:300] / 16.0).astype(np.float32)
    y = data.target[:300].astype(np.int64)
    rows = [(features.tolist(), int(label)) for features, label in zip(x, y, strict=True)]
    df = connect.createDataFrame(rows, "features array<float>, label long").repartition(3)
    converter = make_spark_converter(df, cache_dir=f"file://{tmp_path}/cache")
    try:
        assert len(converter) == len(y)
        shards = SparkRunner(np=2, spark=connect).run(count_rows, converter, batch_size=32)
    finally:
        converter.delete()
    # Two shards of 150 rows; together every row once (an even split pads nothing).
    assert [rows for rows, _ in shards] == [150, 150]
    assert sum(labels for _, labels in shards) == int(y.sum())
