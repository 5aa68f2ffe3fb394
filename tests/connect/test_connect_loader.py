"""A converter made from a Connect DataFrame, read by DDP ranks with shuffling and drop_last."""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner
from sparktrain.data import make_spark_converter

pytestmark = pytest.mark.spark


def read_ids(converter, batch_size, epochs):
    """Every rank's ids, per epoch and batch, gathered on each rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    seen = []
    with converter.make_torch_dataloader(
        batch_size, num_epochs=epochs, shuffle=True, seed=7, drop_last=True
    ) as loader:
        for batch in loader:
            assert batch["x"].shape == (batch_size, 2)
            seen.append([int(i) for i in batch["id"]])
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, seen)
    dist.destroy_process_group()
    return found


def test_shuffled_shards_with_drop_last_from_a_connect_dataframe(connect, tmp_path):
    from pyspark.sql import functions as F

    frame = connect.range(0, 150, 1, 3).select(
        "id", F.array(F.col("id").cast("float"), (F.col("id") * 2).cast("float")).alias("x")
    )
    converter = make_spark_converter(frame, cache_dir=f"file://{tmp_path}/cache")
    try:
        assert len(converter) == 150
        ranks = SparkRunner(np=2, spark=connect).run(read_ids, converter, 16, 2)
    finally:
        converter.delete()
    # 150 rows, 2 ranks, full batches of 16: 4 batches a rank, 128 rows an epoch, 22 left out.
    assert [len(batches) for batches in ranks] == [8, 8]
    epochs = [
        [i for batches in ranks for batch in batches[4 * e : 4 * e + 4] for i in batch]
        for e in range(2)
    ]
    for ids in epochs:
        assert len(ids) == 128 and len(set(ids)) == 128 and set(ids) <= set(range(150))
    assert sorted(epochs[0]) != list(range(128))  # shuffled, not the first rows in order
    assert ranks[0][:4] != ranks[0][4:]  # another order in the second epoch
