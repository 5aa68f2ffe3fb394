"""A result as large as the limit allows comes back from executors whose heap is smaller than
a few copies of it (local-cluster executors have 1 GiB), and costs the cluster nothing."""

from __future__ import annotations

import hashlib

import pytest

from sparktrain import SparkRunner
from tests.fixtures import trainers
from tests.helpers import settled_tracker
from tests.spark.test_cancel import executors

pytestmark = pytest.mark.slow

MIB = 1 << 20


def test_a_250_mib_result_comes_back_whole_and_no_executor_is_lost(spark) -> None:
    assert SparkRunner(np=2).run(trainers.noop) == 0  # every executor has registered
    before = executors(spark)
    result = SparkRunner(np=2).run(trainers.big_result, 250 * MIB)
    assert len(result) == 250 * MIB
    assert hashlib.sha256(result).hexdigest() != hashlib.sha256(b"\0" * len(result)).hexdigest()
    assert executors(spark) == before
    assert settled_tracker(spark).getActiveJobsIds() == []


def test_a_result_over_the_limit_is_refused_and_kept_on_its_host(spark, tmp_path) -> None:
    from sparktrain import WorkerFailedError

    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, max_result_bytes=MIB).run(trainers.big_result, 2 * MIB)
    text = str(info.value)
    assert "pickles to 2.0 MiB, over the limit of 1.0 MiB" in text
    kept = text.split("it is kept in ", 1)[1].split(" on ", 1)[0]
    try:
        import pickle

        with open(kept, "rb") as fh:
            assert len(pickle.load(fh)) == 2 * MIB
    finally:
        import os

        os.unlink(kept)
