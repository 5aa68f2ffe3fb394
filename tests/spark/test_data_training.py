"""DDP on two Spark ranks fed by the data loader learns the digits as well as in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sparktrain import SparkRunner
from sparktrain.data import make_spark_converter

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EPOCHS = 12
GLOBAL_BATCH = 64
RANKS = 2


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1400], order[1400:]
    return x[train], y[train], x[test], y[test]


def make_trainer():
    """The training loop, as closures so cloudpickle ships them by value to the ranks."""

    def build() -> torch.nn.Module:
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )

    def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
        import torch

        with torch.no_grad():
            predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
        return float((predicted == y).mean())

    def train_ddp(converter, test_x, test_y, epochs, batch_size):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(build())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        steps = 0
        # Shards default to this rank and the world size.
        with converter.make_torch_dataloader(batch_size, num_epochs=epochs, seed=1) as loader:
            for batch in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"])
                loss.backward()
                optimizer.step()
                steps += 1
        all_steps = [None] * dist.get_world_size()
        dist.all_gather_object(all_steps, steps)
        result = {"accuracy": accuracy(model.module, test_x, test_y), "steps": all_steps}
        dist.destroy_process_group()
        return result

    def train_in_memory(x, y, test_x, test_y, epochs, batch_size):
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = build()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        generator = torch.Generator().manual_seed(1)
        loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=generator)
        for _ in range(epochs):
            for features, label in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(features), label).backward()
                optimizer.step()
        return accuracy(model, test_x, test_y)

    return train_ddp, train_in_memory


def test_ddp_from_spark_dataframe_matches_in_memory_accuracy(spark, tmp_path: Path):
    from pyspark.ml.linalg import Vectors

    x, y, test_x, test_y = digits()
    train_ddp, train_in_memory = make_trainer()
    baseline = train_in_memory(x, y, test_x, test_y, EPOCHS, GLOBAL_BATCH)

    rows = [
        (Vectors.dense(features.tolist()), int(label)) for features, label in zip(x, y, strict=True)
    ]
    df = spark.createDataFrame(rows, ["features", "label"]).repartition(3)
    converter = make_spark_converter(df, cache_dir=f"file://{tmp_path}/cache")
    try:
        assert len(converter) == len(y)
        result = SparkRunner(np=RANKS).run(
            train_ddp,
            converter=converter,
            test_x=test_x,
            test_y=test_y,
            epochs=EPOCHS,
            batch_size=GLOBAL_BATCH // RANKS,
        )
    finally:
        converter.delete()

    print(f"digits accuracy: DDP from Spark {result['accuracy']:.4f}, in memory {baseline:.4f}")
    rows_per_rank = -(-len(y) // RANKS)  # ceil: one rank pads a row when len(y) is odd
    steps_per_epoch = -(-rows_per_rank // (GLOBAL_BATCH // RANKS))
    assert result["steps"] == [EPOCHS * steps_per_epoch] * RANKS
    assert baseline > 0.9
    assert abs(result["accuracy"] - baseline) <= 0.03, (result["accuracy"], baseline)
