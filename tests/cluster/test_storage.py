"""Each host has its own disk: a local path is not shared, and sparktrain says so."""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from tests.cluster.hosts import HOST_DISK
from tests.fixtures import cluster_trainers

pytestmark = pytest.mark.cluster


def test_a_file_on_a_host_disk_is_seen_on_that_host_only(cluster_spark):
    seen = SparkRunner(np=4).run(cluster_trainers.disk_visibility, path=f"{HOST_DISK}/probe")
    # Ranks are numbered host by host: 0 and 1 share rank 0's disk, 2 and 3 have another.
    assert seen == [True, True, False, False]


def test_local_checkpoint_dir_is_refused_when_ranks_span_hosts(cluster_spark):
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=4).run(cluster_trainers.resume_from, directory=f"{HOST_DISK}/ckpt")
    message = str(info.value)
    assert f"checkpoint directory '{HOST_DISK}/ckpt' is a local path" in message
    assert "2 of 4 ranks on this one" in message
    assert "shared=True" in message
