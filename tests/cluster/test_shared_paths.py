"""Paths declared shared are checked on hosts with disks of their own: a file rank 0 writes
must be seen from every host, else the run fails naming the host that does not see it."""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from sparktrain.data import make_spark_converter
from tests.cluster.hosts import HOST_DISK
from tests.fixtures import shared_path_trainers

pytestmark = pytest.mark.cluster
# How long a rank on another host waits for rank 0's marker before the path counts as not
# shared (the run's start_timeout); the tasks of a warm session arrive well within it.
START_TIMEOUT = 20


def test_a_host_disk_declared_shared_fails_naming_the_host_that_does_not_see_it(
    cluster, cluster_spark
):
    directory = f"{HOST_DISK}/ckpt-shared"
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=4, start_timeout=START_TIMEOUT).run(
            shared_path_trainers.save_and_resume_shared, directory=directory, step=3
        )
    message = str(info.value)
    rank0_host, other = (h.address for h in cluster.hosts.hosts)
    if f"on {rank0_host} (" not in message:
        rank0_host, other = other, rank0_host
    assert f"checkpoint directory '{directory}' was declared shared" in message
    assert f"the file rank 0 writes there on {rank0_host}" in message
    assert f"did not appear on {other} within {START_TIMEOUT}s" in message


def test_a_directory_every_host_mounts_passes_the_check(cluster_spark, tmp_path):
    directory = str(tmp_path / "ckpt")  # outside the host disks: the same on every host
    steps = SparkRunner(np=4, start_timeout=START_TIMEOUT).run(
        shared_path_trainers.save_and_resume_shared, directory=directory, step=3
    )
    assert steps == [3, 3, 3, 3]


def test_a_local_converter_cache_is_refused_unless_declared_and_seen_shared(
    cluster_spark, tmp_path
):
    df = cluster_spark.range(0, 16, 1, 2).selectExpr("CAST(id AS DOUBLE) AS x")
    cache = f"file://{tmp_path}/cache"  # readable by every executor: the driver's check passes
    converter = make_spark_converter(df, cache_dir=cache)
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=4).run(shared_path_trainers.rows_per_rank, converter=converter)
    message = str(info.value)
    assert f"data cache directory '{converter.url}' is a local path" in message
    assert "make_spark_converter(df, shared=True)" in message

    shared = make_spark_converter(df, cache_dir=cache, shared=True)  # the cached files, reused
    assert shared.url == converter.url
    counts = SparkRunner(np=4, start_timeout=START_TIMEOUT).run(
        shared_path_trainers.rows_per_rank, converter=shared
    )
    assert counts == [4, 4, 4, 4]
