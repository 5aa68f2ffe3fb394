"""Sharded checkpoints of an FSDP model (gloo, CPU) on Spark, with the loader's state.

The first test trains 3 steps at 2 ranks on the shared local-cluster, saving sharded with the
loader after each, then loads the newest checkpoint at 3 ranks on the driver into a fresh
FSDP model and saves it again. The reference is the Spark run's step 3 read whole by one
process (DCP's ``dcp_to_torch_save``): the re-saved state must equal it, parameters and Adam's
moments (a model that loaded nothing would save its initial parameters and zero moments); and
the rows the 3 ranks have left, with those the 2 ranks trained, are every row once.

The second is an elastic run (``np=(2, 4)``; the session has 2 task slots, so it runs at 2) in
which rank 1 dies after the sharded checkpoint of step 2: the restarted attempt loads it, the
loader's place included, and the epoch's rows are each trained once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
from tests.fixtures import sharded_trainers
from tests.fixtures.sharded_trainers import assert_same, read_whole

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.spark


def test_fsdp_saved_sharded_on_spark_at_2_ranks_loads_at_3_with_the_loaders_place(
    spark: Any, tmp_path: Path
) -> None:
    directory = str(tmp_path / "ckpt")
    trained = SparkRunner(np=2, progress=False).run_all(
        sharded_trainers.train_and_save, directory, 3
    )
    (step3,) = Path(directory).glob("step-000000000003.*.dcp")
    assert (step3 / "loader.json").exists()
    expected = read_whole(str(step3), tmp_path / "expected.pt")
    assert sorted(expected) == ["model", "optim"] and expected["optim"]["state"]

    seen = SparkRunner(np=-3, progress=False).run_all(
        sharded_trainers.load_and_resave, directory, str(tmp_path / "again")
    )
    assert [s["step"] for s in seen] == [3, 3, 3]
    assert_same(expected, read_whole(seen[0]["path"], tmp_path / "resaved.pt"))
    # 2 ranks x 3 steps x 4 rows trained; the 24 left split 8, 8, 8 at 3 ranks, none padded.
    rows = [i for part in trained for i in part] + [i for s in seen for i in s["rest"]]
    assert sorted(rows) == list(range(sharded_trainers.ROWS))


def test_elastic_fsdp_run_losing_a_rank_resumes_from_the_sharded_checkpoint_every_row_once(
    spark: Any, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    runner = SparkRunner(np=(2, 4), max_restarts=1, grace_period=2, progress=False)
    result = runner.run_all(sharded_trainers.elastic_epoch, str(tmp_path / "ckpt"), str(logs))
    lines = [
        line.split()
        for rank in (0, 1)
        for line in (logs / f"rank{rank}.ids").read_text().splitlines()
    ]
    attempts = Counter(line[0] for line in lines)
    assert attempts == {"0": 2 * 2, "1": 2 * 4}  # 2 steps before the loss, the other 4 after
    trained = Counter(int(i) for line in lines for i in line[1:])
    assert sorted(trained) == list(range(sharded_trainers.ROWS))
    assert set(trained.values()) == {1}
    assert result == [{"steps": 6, "resumed": 2, "attempt": 1, "size": 2}] * 2
    assert runner.last_run.sizes == [2, 2]
    assert "rank 1" in runner.last_run.attempts[0].cause
