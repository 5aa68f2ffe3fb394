"""Training straight from a DataFrame: each task streams its partition to its ranks (np > 0),
or the driver reads it (np < 0). Every row reaches one rank once per epoch, the ranks take
equal steps when they agree, and a failure on either side ends the run with its cause."""

from __future__ import annotations

import importlib.util
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import pytest

from sparktrain import HorovodRunner, SparkRunner
from sparktrain.data import from_dataframe
from sparktrain.errors import ConfigurationError, WorkerFailedError
from tests.conftest import ranks
from tests.fixtures import frame_trainers
from tests.helpers import alive, recorded_pids, wait_for

pytestmark = pytest.mark.spark

ROWS = 300


def _frame(spark: Any, rows: int = ROWS) -> Any:
    return spark.range(rows).selectExpr(
        "id", "CAST(id AS FLOAT) AS x", "array(CAST(id AS FLOAT), 1.0F) AS pair", "'skip' AS s"
    )


def test_every_row_reaches_one_rank_once_per_epoch(mode: str, spark: Any) -> None:
    data = from_dataframe(
        _frame(spark), batch_size=16, num_epochs=2, shuffle=True, seed=3, columns=["id", "pair"]
    )
    results = SparkRunner(np=ranks(mode, 2)).run_all(frame_trainers.read_ids, data)
    for epoch in (0, 1):
        shares = [r["epochs"][epoch] for r in results]
        assert sorted(shares[0] + shares[1]) == list(range(ROWS))
        assert all(shares)  # both ranks read rows
    # The shuffle draws a new order each epoch, from the rows each rank holds.
    first = results[0]["epochs"]
    assert sorted(first[0]) == sorted(first[1]) and first[0] != first[1]
    assert results[0]["shapes"] == {"id": [16], "pair": [16, 2]}


def test_a_resumed_loader_goes_on_with_the_rows_an_uninterrupted_run_reads(spark: Any) -> None:
    frame = _frame(spark, 200)
    data = from_dataframe(frame, batch_size=8, num_epochs=3, shuffle=True, seed=5, columns=["id"])
    runner = SparkRunner(np=-2)
    whole = runner.run_all(frame_trainers.read_ids, data, agree=True)
    state = {"format": "sparktrain.data.from_dataframe/1", "epoch": 1, "steps": 3, "world_size": 2}
    resumed = runner.run_all(frame_trainers.read_ids, data, agree=True, state=state)
    for before, after in zip(whole, resumed, strict=True):
        assert after["epochs"][1] == before["epochs"][1][3 * 8 :]
        assert after["epochs"][2] == before["epochs"][2] and 0 not in after["epochs"]
        assert after["steps"] == {1: before["steps"][1], 2: before["steps"][2]}


def test_ranks_that_agree_take_the_same_steps(mode: str, spark: Any) -> None:
    # 3 pieces of 64 rows for 2 ranks on the driver: one rank holds two, the other one; on
    # executors each rank holds its own partition, of unequal size.
    frame = _frame(spark, 192) if mode == "local" else _frame(spark).where("id < 100 OR id % 3 = 0")
    data = from_dataframe(frame, batch_size=64 if mode == "local" else 8, columns=["id"])
    results = SparkRunner(np=ranks(mode, 2)).run_all(frame_trainers.read_ids, data, agree=True)
    steps = [r["steps"].get(0, 0) for r in results]
    assert steps[0] == steps[1] > 0
    seen = [i for r in results for i in r["epochs"][0]]
    assert len(seen) == len(set(seen))


@pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None, reason="needs the installed Horovod"
)
def test_ranks_of_the_installed_horovod_agree_without_torch_distributed(spark: Any) -> None:
    # Three pieces of 64 rows for two ranks on the driver: one rank holds two, the other one.
    # The installed Horovod initializes no torch.distributed group: the loader agrees through
    # Horovod's own all-reduce, or the rank with more would wait at its last one forever.
    data = from_dataframe(_frame(spark, 192), batch_size=64, columns=["id"])
    runner = HorovodRunner(np=-2, horovod_impl="horovod", stall_timeout=60, progress=False)
    results = runner.run_all(frame_trainers.read_ids, data, agree="horovod")
    assert [r["steps"].get(0, 0) for r in results] == [1, 1]
    seen = [i for r in results for i in r["epochs"][0]]
    assert len(seen) == len(set(seen)) == 128


def test_without_a_repartition_each_task_streams_one_of_the_frame_s_own_partitions(
    spark: Any,
) -> None:
    frame = spark.range(0, 400, 1, 2)  # two partitions of 200 ids, in order
    data = from_dataframe(frame, batch_size=32, columns=["id"], repartition=False)
    results = SparkRunner(np=2).run_all(frame_trainers.read_ids, data)
    shares = sorted((r["epochs"][0] for r in results), key=lambda ids: ids[0])
    # No shuffle deals the rows: each task reads one whole partition, in the frame's order.
    assert shares == [list(range(0, 200)), list(range(200, 400))]


def test_a_frame_not_in_one_partition_per_task_is_refused_without_a_repartition(
    spark: Any,
) -> None:
    for partitions in (1, 3):
        data = from_dataframe(spark.range(0, 100, 1, partitions), batch_size=8, repartition=False)
        with pytest.raises(ConfigurationError, match=f"has {partitions} for 2 tasks: use "):
            SparkRunner(np=2).run(frame_trainers.read_ids, data)


def test_a_rank_killed_while_reading_ends_the_run(mode: str, spark: Any, tmp_path: Path) -> None:
    data = from_dataframe(_frame(spark, 4000), batch_size=8, window=1)
    with pytest.raises(WorkerFailedError) as failed:
        SparkRunner(np=ranks(mode, 2)).run(frame_trainers.die_reading, data, str(tmp_path))
    assert failed.value.root_cause.rank == 1
    assert "was killed by SIGKILL" in str(failed.value)
    wait_for(lambda: alive(recorded_pids(tmp_path)) == [], 30, "every rank gone")


def test_a_failing_dataframe_reaches_the_ranks_with_sparks_message(mode: str, spark: Any) -> None:
    frame = _frame(spark).selectExpr(
        "id", "IF(id = 250, raise_error('row 250 is bad'), id) AS checked"
    )
    data = from_dataframe(frame, batch_size=8)
    with pytest.raises(WorkerFailedError) as failed:
        SparkRunner(np=ranks(mode, 2)).run(frame_trainers.read_ids, data)
    assert "row 250 is bad" in str(failed.value)


def test_bad_input_is_refused_before_anything_starts(spark: Any) -> None:
    frame = _frame(spark)
    with pytest.raises(ConfigurationError, match=r"columns \['nope'\] are not in the DataFrame"):
        from_dataframe(frame, batch_size=8, columns=["id", "nope"])
    with pytest.raises(ConfigurationError, match="batch_size must be an int >= 1, not 0"):
        from_dataframe(frame, batch_size=0)
    with pytest.raises(ConfigurationError, match="column 'when' has type timestamp"):
        from_dataframe(frame.selectExpr("id", "current_timestamp() AS when"), batch_size=8)
    one, two = from_dataframe(frame, batch_size=8), from_dataframe(frame, batch_size=8)
    with pytest.raises(ConfigurationError, match="one run reads one DataFrame, but argument 0, ag"):
        SparkRunner(np=2).run(frame_trainers.read_ids, one, agree=two)


def test_a_local_run_stopped_while_the_driver_computes_a_partition_ends(
    spark: Any, tmp_path: Path
) -> None:
    """np < 0: the driver's reader is inside a partition that takes minutes; stopping the run
    ends it, and cancels that Spark job (the shared session's slots come back)."""
    slow = spark.range(0, 40_000, 1, 2).selectExpr(
        "id", "reflect('java.lang.Thread', 'sleep', CAST(10 AS BIGINT)) AS nap"
    )
    data = from_dataframe(slow, batch_size=8, columns=["id"])
    handle = SparkRunner(np=-2).submit(frame_trainers.read_ids, data)
    tracker = spark.sparkContext.statusTracker()
    wait_for(lambda: tracker.getActiveJobsIds(), 60, "the reader's Spark job")
    assert handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(60)
    wait_for(lambda: not tracker.getActiveJobsIds(), 60, "the reader's job cancelled")


def test_a_global_shuffle_sends_any_row_to_any_rank_the_same_for_a_seed(
    mode: str, spark: Any
) -> None:
    frame = _frame(spark, 200)

    def shares(**options: Any) -> list[list[int]]:
        data = from_dataframe(frame, batch_size=8, columns=["id"], **options)
        results = SparkRunner(np=ranks(mode, 2)).run_all(frame_trainers.read_ids, data)
        return [r["epochs"].get(0, []) for r in results]

    plain = shares()
    mixed = shares(global_shuffle=True, seed=11)
    assert sorted(mixed[0] + mixed[1]) == list(range(200)) and all(mixed)
    assert [sorted(s) for s in mixed] != [sorted(s) for s in plain]
    again = shares(global_shuffle=True, seed=11)
    assert [sorted(s) for s in again] == [sorted(s) for s in mixed]
    other = shares(global_shuffle=True, seed=12)
    assert [sorted(s) for s in other] != [sorted(s) for s in mixed]


def test_empty_shares_end_the_epoch_for_every_rank_without_a_hang(mode: str, spark: Any) -> None:
    one_row = from_dataframe(spark.range(1), batch_size=4)
    results = SparkRunner(np=ranks(mode, 2)).run_all(frame_trainers.read_ids, one_row, agree=True)
    assert [r["steps"] for r in results] == [{}, {}]  # the rank with no row has no step
    alone = SparkRunner(np=ranks(mode, 2)).run_all(frame_trainers.read_ids, one_row)
    assert sorted(i for r in alone for i in r["epochs"].get(0, [])) == [0]
    empty = from_dataframe(spark.range(0), batch_size=4)
    results = SparkRunner(np=ranks(mode, 2)).run_all(frame_trainers.read_ids, empty, agree=True)
    assert [r["epochs"] for r in results] == [{}, {}]


def test_a_rank_killed_mid_epoch_restarts_and_reads_each_row_once(
    spark: Any, tmp_path: Path
) -> None:
    """The loader's place saved every 4 batches; a SIGKILL at batch 6 of epoch 1 restarts the
    run, which goes on from batch 4: with the batches read after it dropped (the model's state
    is that of the checkpoint), every row is read once in each epoch, none twice."""
    folder, logs = tmp_path / "ckpt", tmp_path / "logs"
    logs.mkdir()
    # 24 pieces of 8 rows, 12 to each rank: equal shares, so the equal-steps rule drops none.
    data = from_dataframe(_frame(spark, 192), batch_size=8, num_epochs=2, shuffle=True, seed=2)
    runner = SparkRunner(np=-2, max_restarts=1, grace_period=2)
    runner.run(frame_trainers.resume_reading, data, str(folder), str(logs))
    assert len(runner.attempts) == 2
    read: dict[int, list[int]] = {0: [], 1: []}
    for rank in (0, 1):
        for attempt in (0, 1):
            for line in (logs / f"{rank}-{attempt}.ids").read_text().splitlines():
                epoch, step, *ids = (int(v) for v in line.split())
                if attempt == 0 and (epoch, step) > (1, 4):
                    continue  # after the checkpoint the restart went on from
                read[epoch].extend(ids)
    assert sorted(read[0]) == list(range(192))
    assert sorted(read[1]) == list(range(192))
