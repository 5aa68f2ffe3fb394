"""``run_all`` on executors: every rank's value comes back by rank, and what does not fit in
``max_result_bytes`` (the total) is kept where it is, every file named in the error."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sparktrain import SparkRunner, WorkerFailedError, load_kept
from tests.fixtures import trainers
from tests.helpers import settled_tracker

MIB = 1 << 20


def test_run_all_returns_every_ranks_value_by_rank(spark) -> None:
    placed = SparkRunner(np=2, progress=False).run_all(trainers.placed)
    assert [rank for rank, _, _ in placed] == [0, 1]
    # One rank per executor, in a process of its own; both executors are on this host, one
    # node, so their local ranks count up.
    assert [local for _, local, _ in placed] == [0, 1]
    assert len({pid for _, _, pid in placed}) == 2


def test_results_over_the_total_are_kept_and_every_file_is_named(spark) -> None:
    sizes = {0: 700_000, 1: 700_000}  # each fits in 1 MiB, both together do not
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, progress=False, max_result_bytes=MIB).run_all(
            trainers.sized_results, sizes
        )
    text = str(info.value)
    assert f"the ranks' results together are larger than max_result_bytes ({MIB} bytes)" in text
    # One rank's value was refused and kept on its executor's host; the other reached the
    # driver first and the driver kept it, as the run failed. Which is which is a race.
    paths = sorted(set(re.findall(r"it is kept in (\S+\.pkl)", text)))
    try:
        assert sorted(re.sub(r".*-(rank\d)\.pkl", r"\1", p) for p in paths) == ["rank0", "rank1"]
        assert [len(load_kept(p)) for p in paths] == [700_000, 700_000]
    finally:
        for path in paths:
            Path(path).unlink(missing_ok=True)
    assert settled_tracker(spark).getActiveJobsIds() == []


def test_run_all_keeps_a_ranks_own_value_over_the_limit_naming_the_rank(spark) -> None:
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, progress=False, max_result_bytes=MIB).run_all(
            trainers.sized_results, {1: 2 * MIB}
        )
    text = str(info.value)
    assert "rank 1's return value pickles to 2.0 MiB, over the limit of 1.0 MiB" in text
    paths = set(re.findall(r"it is kept in (\S+\.pkl)", text))
    try:
        (kept,) = [p for p in paths if p.endswith("-rank1.pkl")]
        assert len(load_kept(kept)) == 2 * MIB
    finally:
        for path in paths:  # rank 0's too, where the driver or its task kept it
            os.unlink(path)
