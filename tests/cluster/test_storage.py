"""Each host has its own disk: a local path is not shared, and sparktrain says so."""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from sparktrain.data import make_spark_converter
from tests.cluster.hosts import HOST_DISK
from tests.fixtures import cluster_trainers, shared_path_trainers

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
    assert "(4 ranks on 2 hosts)" in message
    assert "shared=True" in message


def test_a_converter_cache_on_s3_is_written_by_the_tasks_and_read_on_every_host(
    cluster_spark, cluster_s3
):
    # The cluster's Spark has no S3A jars: its writer fails, and the tasks write through s3fs.
    bucket = cluster_s3.new_bucket("cache")
    df = cluster_spark.range(0, 64, 1, 4).selectExpr("CAST(id AS DOUBLE) AS x")
    converter = make_spark_converter(
        df, cache_dir=f"s3a://{bucket}/cache", storage_options=cluster_s3.storage_options
    )
    assert converter.url.startswith(f"s3a://{bucket}/cache/df-")
    stored = sorted(path.rsplit("/", 1)[1] for path in cluster_s3.fs().find(bucket))
    assert stored == sorted([*converter.files, "_sparktrain_manifest.json"])
    assert len(converter.files) == 4
    counts = SparkRunner(np=4).run(shared_path_trainers.rows_per_rank, converter=converter)
    assert counts == [16, 16, 16, 16]
