"""DDP training straight from a DataFrame on two hosts that share no folder: the run is given
no path at all, the driver works from its own disk, and each rank's stream keeps its files in
its own executor's Spark local dir. The ranks reach the parameters that one process reaches
reading the same rows in the same order, averaging each step's batches as DDP does."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sparktrain import SparkRunner
from sparktrain.data import from_dataframe
from tests.cluster.hosts import HOST_DISK
from tests.fixtures import frame_host_trainers as trainers

pytestmark = pytest.mark.cluster

# 4 ranks (2 per host: each host has 2 executors): 72 rows each, 5 batches of 16 (the last
# one of 8) per epoch, so every row is read once in each epoch.
NP = 4
ROWS = 288
BATCH = 16
EPOCHS = 2


@pytest.fixture
def driver_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The driver's working folder on its own disk, which no host sees."""
    with tempfile.TemporaryDirectory(prefix="frame-", dir=HOST_DISK) as folder:
        monkeypatch.chdir(folder)
        yield Path(folder)


def frame(spark: Any) -> Any:
    """Deterministic rows (no file behind them): three features and a label from the id."""
    return spark.range(0, ROWS, 1, 1).selectExpr(
        "id",
        "sin(CAST(id AS DOUBLE)) AS a",
        "CAST(id % 10 AS DOUBLE) / 10 AS b",
        "cos(CAST(id AS DOUBLE) * 0.3) AS c",
        "1.5 * sin(CAST(id AS DOUBLE)) - 0.2 * (id % 10) + 0.5 * cos(CAST(id AS DOUBLE) * 0.3) "
        "+ 0.25 AS label",
        "'unused' AS note",
    )


def reference(rows: dict[int, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """One process, no DDP: at each step the mean of the ranks' batch losses (DDP averages
    their gradients), the batches rebuilt from the ids each rank read at that step."""
    model = trainers.linear_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=trainers.LR)
    for step in zip(*(r["steps"] for r in results), strict=True):
        losses = []
        for _, ids in step:
            features = [[rows[i][f] for f in trainers.FEATURES] for i in ids]
            x = torch.tensor(features, dtype=torch.float64)  # DOUBLE columns, as on the ranks
            y = torch.tensor([rows[i]["label"] for i in ids], dtype=torch.float64)
            losses.append(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
        optimizer.zero_grad()
        torch.stack(losses).mean().backward()
        optimizer.step()
    return model.state_dict()


def test_ddp_from_a_dataframe_on_two_hosts_matches_one_process(cluster, cluster_spark, driver_disk):
    df = frame(cluster_spark)
    data = from_dataframe(
        df,
        batch_size=BATCH,
        num_epochs=EPOCHS,
        shuffle=False,
        columns=["id", "a", "b", "c", "label"],
    )
    results = sorted(SparkRunner(np=NP).run_all(trainers.train_ddp, data), key=lambda r: r["rank"])

    assert [r["rank"] for r in results] == list(range(NP))
    assert {r["host"] for r in results} == {h.netns for h in cluster.hosts.hosts}
    for epoch in range(EPOCHS):
        read = [i for r in results for e, ids in r["steps"] if e == epoch for i in ids]
        assert sorted(read) == list(range(ROWS)), f"epoch {epoch}: not every row once"
        steps = {sum(e == epoch for e, _ in r["steps"]) for r in results}
        assert steps == {ROWS // NP // BATCH + 1}, f"epoch {epoch}: unequal steps {steps}"
    for step in zip(*(r["steps"] for r in results), strict=True):
        assert len({e for e, _ in step}) == 1, "the ranks' steps are out of line"

    rows = {row["id"]: row.asDict() for row in df.collect()}
    expected = reference(rows, results)
    start = trainers.linear_model().state_dict()
    for r in results:
        assert r["params"].keys() == expected.keys()
        for name, value in expected.items():
            got = torch.tensor(r["params"][name], dtype=value.dtype)
            assert torch.allclose(got, value, rtol=0, atol=1e-9), (
                f"rank {r['rank']}'s {name} {got.tolist()} != one process's {value.tolist()}"
            )
            assert not torch.allclose(value, start[name], atol=1e-3)

    # Nothing on shared storage: the run was given no folder, and what each rank's stream
    # wrote (its first epoch's spill, read back for the second) lies in its own executor's
    # Spark local dir (the folder its host's Worker gave it), which no other executor uses.
    dirs = [r["stream_dir"] for r in results]
    assert all(dirs) and len(set(dirs)) == NP, dirs
    for r in results:
        assert r["stream_dir"] in r["spark_local_dirs"].split(","), r
        spills = [f for f in r["files"] if "/stream-spills/spill-" in f]
        assert spills and all(f.startswith(r["stream_dir"] + "/") for f in spills), r["files"]
    assert not list(driver_disk.iterdir()), "the run wrote into the driver's working folder"
