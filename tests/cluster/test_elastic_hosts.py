"""An elastic run (np=(2, 4)) loses a host mid-epoch, goes on at 2 ranks while the host stays
down, and grows back to 4 at a checkpoint once the host's Worker is back.

The loop trains an FSDP model (sharded across the ranks) on the DataFrame loader (its cache on
a folder every host mounts) and saves sharded checkpoints (``save(..., sharded=True)``: each
rank its shards, with the loader's place) to the tier's S3 after every step, each attempt
loading them at its own size (4, 2, then 4 again); its model counts each row's training per
epoch (tests/fixtures/row_counting.py). Whatever the sizes, every row of every epoch is
trained on exactly once, which both the ranks' records of their steps and the final model
show. The cluster is whole again afterwards, for the tier's other tests.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.data import make_spark_converter
from tests.cluster.conftest import EXECUTORS_PER_HOST, HOSTS
from tests.conftest import wait_for_executors
from tests.fixtures import row_counting
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster

FULL = HOSTS * EXECUTORS_PER_HOST
ROWS, EPOCHS, BATCH = 32, 2, 2
KILL_AFTER = 2  # attempt 0 is lost after 2 of epoch 0's 4 steps at 4 ranks


def _reported(handle: Any, metric: str, attempt: int) -> int:
    """How many ranks of ``attempt`` have reported ``metric`` so far."""
    record = handle.record
    reports = list(record.reports) if record is not None else []
    return sum(metric in r["metrics"] and r["metrics"].get("attempt") == attempt for r in reports)


# Its own waits (each with its deadline and what it waited for) add up to 11 minutes: the
# suite's 5-minute limit for a hung test would cut a slow but healthy run short of them.
@pytest.mark.timeout(900)
def test_lost_host_shrinks_to_two_then_grows_back_with_every_row_once(
    cluster, cluster_spark, cluster_s3, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="sparktrain")
    bucket = cluster_s3.new_bucket("elastic")
    df = cluster_spark.range(0, ROWS, 1, 4).selectExpr("id")
    # The data on a folder every host mounts (Spark writes it at once, where on the tier's S3
    # it would fall back to the tasks); the checkpoints and the ranks' records on S3.
    converter = make_spark_converter(df, cache_dir=f"file://{tmp_path}/cache", shared=True)
    back_url = f"s3://{bucket}/capacity-back"
    victim = cluster.hosts.hosts[-1]
    runner = SparkRunner(
        np=(2, FULL),
        max_restarts=1,
        resize_interval=1,
        grace_period=5,
        env=cluster_s3.env,
        progress=False,
    )
    handle = runner.submit(
        row_counting.train,
        converter,
        f"s3://{bucket}/ckpt",
        f"s3://{bucket}/rows",
        epochs=EPOCHS,
        batch_size=BATCH,
        kill_after=KILL_AFTER,
        full=FULL,
        back_url=back_url,
        sharded=True,
    )
    killed = restarted = False
    try:
        wait_for(
            lambda: _reported(handle, row_counting.AT_KILL_POINT, 0) == FULL or handle.done(),
            180,
            "every rank of attempt 0 at the kill point",
        )
        assert not handle.done(), handle.exception()
        cluster.hosts.kill_host(victim)
        killed = True
        # The host stays down: the run goes on at the 2 ranks the other host runs.
        wait_for(
            lambda: _reported(handle, row_counting.WAITING, 1) == 2 or handle.done(),
            180,
            "attempt 1's ranks waiting for capacity",
        )
        assert not handle.done(), handle.exception()
        assert handle.sizes == [FULL, 2]
        assert handle.status() == f"running on 2 ranks (np=(2, {FULL}))"
        cluster.restart_worker(victim)
        restarted = True
        wait_for_executors(cluster_spark, FULL, 120, cluster.executor_logs)
        cluster_s3.fs().pipe_file(back_url, b"back")  # the ranks go on: the next save grows
        result = handle.result(timeout=180)
    finally:
        if not handle.done():
            handle.cancel()
        if killed and not restarted:
            cluster.restart_worker(victim)
        # Whatever happened, the next test needs all four executors back.
        wait_for_executors(cluster_spark, FULL, 120, cluster.executor_logs)

    record = runner.last_run
    assert record.sizes == [FULL, 2, FULL], record.describe()
    lost, smaller, larger = record.attempts
    assert "its Spark task vanished" in lost.cause and f"on {victim.address}" in lost.cause
    assert "free task slots" in lost.size_reason
    assert "restart 1/1 after" in smaller.size_reason and "without waiting" in smaller.size_reason
    assert smaller.resized and f"grow from 2 to {FULL} ranks" in smaller.cause, smaller.cause
    assert larger.error is None and larger.size_reason == smaller.cause
    assert f"elastic run np=(2, {FULL}): 2 ranks (was {FULL}): restart 1/1" in caplog.text
    assert f"elastic run np=(2, {FULL}): {FULL} ranks (was 2): grow from 2" in caplog.text
    # What the stopped ranks returned at should_stop() is nobody's result: not kept, not
    # warned about (the run returned the larger attempt's value).
    assert "returns no value" not in caplog.text

    fs = cluster_s3.fs()
    # The checkpoints are sharded ones: a folder of every rank's shards per step, each with
    # DCP's metadata, its loader state and a commit marker that says so.
    saved = [p.rsplit("/", 1)[1] for p in fs.ls(f"{bucket}/ckpt", detail=False)]
    folders = [name for name in saved if name.endswith(".dcp")]
    assert folders and all(f"{name.split('.')[0]}.commit.json" in saved for name in folders)
    newest = max(folders)
    assert {".metadata", "loader.json"} <= {
        p.rsplit("/", 1)[1] for p in fs.ls(f"{bucket}/ckpt/{newest}", detail=False)
    }
    steps = row_counting.read_steps(fs, f"{bucket}/rows")
    # Attempt 0 waited at the kill point right after its checkpoint: nothing of it was lost.
    assert steps.resumed == {0: 0, 1: KILL_AFTER, 2: steps.resumed[2]}
    grown_at = int(smaller.cause.rsplit("checkpoint step ", 1)[1].rstrip(")"))
    assert steps.resumed[2] >= grown_at > KILL_AFTER + 1  # a step at 2 ranks, the wait, a save
    ranks = {(s.attempt, s.size, s.rank) for s in steps.steps}
    assert ranks == {(a, n, r) for a, n in ((0, FULL), (1, 2), (2, FULL)) for r in range(n)}
    # Epoch 0 ran at 4, 2 and 4 ranks; every row of both epochs was trained on exactly once
    # by the steps that reached the model (steps after the grow's checkpoint were done again).
    counts = steps.counts()
    assert counts == {(e, i): 1 for e in range(EPOCHS) for i in range(ROWS)}
    assert row_counting.off_by_rows(steps, EPOCHS, ROWS) == (0, 0)
    assert all(s.attempt == 1 and s.step > steps.resumed[2] for s in steps.redone())
    # The model is what the steps say: one per (epoch, row) they trained on.
    assert result["agree"] and result["size"] == FULL and result["attempt"] == 2
    assert result["seen"] == [[float(counts[(e, i)]) for i in range(ROWS)] for e in range(EPOCHS)]
    last = max(s.step for s in steps.steps if s.attempt == 2)
    assert result["steps"] == last
