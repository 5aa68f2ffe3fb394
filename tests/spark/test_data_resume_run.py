"""A run restarted mid-epoch trains every row of the epoch once (the loader in the checkpoint)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sparktrain import SparkRunner
from tests.fixtures import exact_resume
from tests.unit.test_data_sharding import write_ids

ROWS = 64  # 2 ranks x 8 batches of 4 per epoch, no padding


def test_rank_killed_mid_epoch_resumes_with_every_row_once(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", ROWS)
    logs = tmp_path / "logs"
    logs.mkdir()
    runner = SparkRunner(np=-2, max_restarts=1, grace_period=2, timeout=240)
    result = runner.run(
        exact_resume.train_rows, converter, str(tmp_path / "ckpt"), str(logs), epochs=2
    )
    lines = [
        line.split()
        for rank in (0, 1)
        for line in (logs / f"rank{rank}.ids").read_text().splitlines()
    ]
    attempts = Counter(line[0] for line in lines)
    assert attempts["0"] == 2 * 3 and attempts["1"] > 0  # killed after step 3, then restarted
    for epoch in ("0", "1"):
        trained = Counter(int(i) for line in lines if line[1] == epoch for i in line[2:])
        assert sorted(trained) == list(range(ROWS)) and set(trained.values()) == {1}, epoch
    # 2 epochs of 8 steps: 3 before the loss, 13 after it, none repeated.
    assert result == {"steps": 16, "attempt": 1}
