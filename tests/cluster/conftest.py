"""The cluster tier: a Spark standalone cluster whose Workers are hosts made of Linux
namespaces (see tests/cluster/hosts.py), shared by every test of this folder.

2 hosts × 2 executors of 1 core and 512 MiB; each host offers two fake GPUs, one per executor.
The tier needs root (network namespaces, veth pairs, a bridge, mounts) and skips without it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.hosts import chosen_slot, claim_early
from tests.cluster.shared_s3 import SharedS3, shared_s3
from tests.cluster.standalone import StandaloneCluster, standalone_cluster
from tests.conftest import spark_test_conf, wait_for_executors
from tests.helpers import time_calls_only, under
from tests.workers import claims_cluster_hosts

# Where the tier's hosts may be made (prefix, /24 in 198.18.0.0/16): namespaces stclu-h1,
# stclu-h2, bridge stclubr on 198.18.1.0/24, or the next slot's when another test run on the
# machine holds the first (test_teardown.py's hosts use 198.18.2.0/24).
SLOTS = (("stclu", 1), ("stcl3", 3), ("stcl4", 4))
HOSTS = 2
EXECUTORS_PER_HOST = 2
GPUS_PER_HOST = 2


def missing_requirement() -> str | None:
    """Why this machine cannot run the tier, or None when it can."""
    if os.geteuid() != 0:
        return "the cluster tier makes network namespaces, veth pairs and mounts: run as root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the cluster tier needs '{tool}' (iproute2 / util-linux)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Java 17+ is needed for Spark tests (install openjdk-17-jre-headless)"
    return None


def cluster_conf(cluster: StandaloneCluster) -> dict[str, str]:
    """The session's Spark settings: the test defaults, pointed at the namespaced cluster."""
    conf = {
        key: value
        for key, value in spark_test_conf().items()
        if not key.startswith("spark.worker.")  # each Worker has its own discovery script
    }
    conf.update(
        {
            "spark.driver.host": cluster.hosts.gateway,
            "spark.driver.bindAddress": cluster.hosts.gateway,
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            "spark.cores.max": str(HOSTS * EXECUTORS_PER_HOST),
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": "1",
        }
    )
    return conf


def pytest_collection_finish(session: pytest.Session) -> None:
    """Lock a slot for the tier's hosts before the first test: a free one, or, when other runs
    on this machine hold them all, the first once its run is done with it.

    That wait (up to half an hour, said every 30 s) happens here, outside the time limit of the
    test that first needs the cluster; without it, each test of the tier would spend its whole
    limit waiting and fail.
    """
    if missing_requirement() is not None or not claims_cluster_hosts():
        return
    if any("cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        say = reporter.write_line if reporter is not None else print
        claim_early(SLOTS, say=say)


@pytest.fixture(scope="package")
def cluster() -> Iterator[StandaloneCluster]:
    """The started cluster; torn down (and checked to be gone) after the tier's last test."""
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    prefix, net = chosen_slot(SLOTS)
    with standalone_cluster(
        prefix, net, HOSTS, cores=EXECUTORS_PER_HOST, gpus=GPUS_PER_HOST
    ) as made:
        yield made


@pytest.fixture(scope="package")
def cluster_spark(cluster: StandaloneCluster):
    """A SparkSession on the cluster, with all four executors registered."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        pytest.fail(
            "a SparkSession of another tier is active; the cluster tier needs its own: run "
            "tests/cluster before tests/spark (pytest's default order) or on its own"
        )
    builder = SparkSession.builder.master(cluster.master_url).appName("sparktrain-cluster")
    for key, value in cluster_conf(cluster).items():
        builder = builder.config(key, value)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        session = builder.getOrCreate()
        try:
            wait_for_executors(session, HOSTS * EXECUTORS_PER_HOST, 120, cluster.executor_logs)
            yield session
        finally:
            session.stop()
            forget_conf(session, cluster_conf(cluster))


@pytest.fixture(scope="package")
def cluster_s3(cluster: StandaloneCluster) -> Iterator[SharedS3]:
    """Shared storage: an S3 endpoint on the bridge's address, which every host reaches."""
    pytest.importorskip("s3fs", reason="s3fs is needed for shared storage on the cluster tier")
    pytest.importorskip("moto.server", reason="moto[server] is needed for the cluster's S3")
    with shared_s3(cluster.hosts.gateway) as made:
        yield made


def forget_conf(session, conf: dict[str, str]) -> None:
    """Drop this tier's settings from the JVM, so the next tier's session does not inherit them.

    PySpark starts its JVM with the first session's settings as system properties, and every
    later SparkConf reads those: a later local-cluster session would try to bind to the
    bridge's address, gone by then.
    """
    system = session.sparkContext._jvm.System
    for key in [*conf, "spark.master", "spark.app.name"]:
        system.clearProperty(key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules that set ``OWN_SESSION = True`` stop the tier's session and start one with
    other settings: they run after every other test of the tier, which keeps the shared
    session for the whole of its use.

    The tier's cluster starts in its first test's setup under limits of its own (hosts, master,
    Workers, executors), which took over 300 s beside two other suites: the tests are timed
    from their own call (see time_calls_only)."""
    time_calls_only(config, items, under(Path(__file__).resolve().parent))
    positions = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/cluster/")]
    tier = sorted(
        (items[i] for i in positions),
        key=lambda item: bool(getattr(item.module, "OWN_SESSION", False)),
    )
    for position, item in zip(positions, tier, strict=True):
        items[position] = item


def stop_active_session(conf: dict[str, str]) -> None:
    """Stop the active SparkSession, if any (the tier's), and drop ``conf`` from the JVM."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
        forget_conf(active, conf)
