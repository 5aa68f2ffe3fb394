"""Two GPUs per task on two hosts: each task runs two ranks, one per GPU, and every rank's
``cuda:{LOCAL_RANK}``, ``hvd.local_rank()`` and the worker's own pin name its own GPU.

The tier's session gives each task one GPU; this module runs on a session of its own (one
executor of 1 core and 2 GPUs per host, 2 GPUs per task), after the tier's other tests.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from sparktrain import CapacityError, ConfigurationError, HorovodRunner, SparkRunner
from tests.cluster.conftest import (
    HOSTS,
    cluster_conf,
    forget_conf,
    stop_active_session,
)
from tests.cluster.standalone import StandaloneCluster
from tests.conftest import wait_for_executors
from tests.fixtures import gpu_task_trainers

pytestmark = pytest.mark.cluster
OWN_SESSION = True  # see tests/cluster/conftest.py: runs after the tier's shared session


def gpu2_conf(cluster: StandaloneCluster) -> dict[str, str]:
    """One executor per host holding both of its GPUs; each task takes both."""
    return cluster_conf(cluster) | {
        "spark.executor.cores": "1",
        "spark.cores.max": str(HOSTS),
        "spark.executor.resource.gpu.amount": "2",
        "spark.task.resource.gpu.amount": "2",
        "spark.app.name": "sparktrain-cluster-gpu2",
    }


@pytest.fixture(scope="module")
def gpu2_spark(cluster: StandaloneCluster) -> Iterator[object]:
    from pyspark.sql import SparkSession

    stop_active_session(cluster_conf(cluster))
    conf = gpu2_conf(cluster)
    builder = SparkSession.builder.master(cluster.master_url)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        session = builder.getOrCreate()
        try:
            wait_for_executors(session, HOSTS, 120, cluster.executor_logs)
            yield session
        finally:
            session.stop()
            forget_conf(session, conf)


def _by_task(reports: list[dict]) -> dict[int, list[dict]]:
    tasks: dict[int, list[dict]] = {}
    for r in reports:
        tasks.setdefault(r["task_pid"], []).append(r)
    return tasks


def test_two_ranks_per_task_one_per_gpu(cluster, gpu2_spark):
    reports = SparkRunner(np=4).run(gpu_task_trainers.ddp_devices, steps=3)
    host_of = {h.address: h.name for h in cluster.hosts.hosts}

    assert [int(r["RANK"]) for r in reports] == [0, 1, 2, 3]
    tasks = _by_task(reports)
    assert sorted(len(ranks) for ranks in tasks.values()) == [2, 2], "2 tasks of 2 ranks"
    rank0_host = next(a for a in reports[0]["addresses"] if a in host_of)
    for ranks in tasks.values():
        hosts = {a for r in ranks for a in r["addresses"] if a in host_of}
        assert len(hosts) == 1, "a task's ranks run on its host"
        (host,) = hosts
        assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"]
        for r in ranks:
            assert r["LOCAL_WORLD_SIZE"] == "2" and r["WORLD_SIZE"] == "4"
            assert r["NODE_RANK"] == ("0" if host == rank0_host else "1")
            assert r["MASTER_ADDR"] == rank0_host
            # Both of the task's GPUs, ordered so that cuda:{LOCAL_RANK} is the rank's own...
            assert r["CUDA_VISIBLE_DEVICES"] == "0,1"
            # ...and the worker's own pin agrees with it.
            assert r["pinned"] == r["cuda_local_rank"]
        assert sorted(r["cuda_local_rank"] for r in ranks) == ["0", "1"], "distinct GPUs"
    first = reports[0]["params"]
    assert all(r["params"] == first for r in reports), "DDP ranks disagree on the parameters"


def test_hvd_local_rank_pins_each_rank_of_a_task_to_its_own_gpu(cluster, gpu2_spark):
    places = HorovodRunner(np=4, horovod_impl="builtin").run(gpu_task_trainers.hvd_places)
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    for ranks in _by_task(places).values():
        assert sorted(p["local_rank"] for p in ranks) == [0, 1]
        assert {p["local_size"] for p in ranks} == {2}
        assert len({p["cross_rank"] for p in ranks}) == 1
        assert sorted(p["hvd_gpu"] for p in ranks) == ["0", "1"]
        assert all(p["hvd_gpu"] == p["pinned"] for p in ranks)
    assert sorted({p["cross_rank"] for p in places}) == [0, 1]


def test_np_not_a_multiple_of_the_gpus_per_task_is_refused_before_submitting(gpu2_spark):
    runner = SparkRunner(np=3)
    with pytest.raises(ConfigurationError) as info:
        runner.run(gpu_task_trainers.ddp_devices)
    assert "np=3 is not a multiple of spark.task.resource.gpu.amount=2" in str(info.value)
    assert "Set np to 2 or 4" in str(info.value)
    assert runner.last_run is None, "no attempt may start"


def test_capacity_counts_tasks_of_two_ranks(gpu2_spark):
    with pytest.raises(CapacityError) as info:
        SparkRunner(np=6).run(gpu_task_trainers.ddp_devices)
    message = str(info.value)
    assert "np=6 (3 tasks of 2 ranks, one per GPU) needs 3 task slots" in message
    assert "Lower np to 4 or less" in message


def test_a_task_of_two_ranks_splits_its_partition_between_them(cluster, gpu2_spark):
    """np=4 given a DataFrame: each of the 2 tasks streams its partition to its 2 ranks, in
    pieces of a batch, so every row reaches one rank once and each rank gets a share."""
    from sparktrain.data import from_dataframe
    from tests.fixtures import frame_trainers

    frame = gpu2_spark.range(400).selectExpr("id")
    results = SparkRunner(np=4).run_all(frame_trainers.read_ids, from_dataframe(frame, 10))
    shares = [r["epochs"].get(0, []) for r in results]
    assert sorted(i for share in shares for i in share) == list(range(400))
    assert all(shares), [len(share) for share in shares]
