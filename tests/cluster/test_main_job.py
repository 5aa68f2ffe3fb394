"""The main job as a user runs it against a cluster: ``python -m sparktrain.examples.digits
--master spark://...`` in a driver process of its own, four ranks over both hosts, checkpoints
on the shared S3 store, Spark's settings in ``SPARK_CONF_DIR/spark-defaults.conf``.

The driver is a new Spark application, so it needs the cluster's cores: this module runs after
the tier's shared session (``OWN_SESSION``), which it stops first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import EXECUTORS_PER_HOST, HOSTS, cluster_conf, stop_active_session
from tests.cluster.shared_s3 import SharedS3
from tests.cluster.standalone import StandaloneCluster

pytestmark = pytest.mark.cluster
OWN_SESSION = True  # see tests/cluster/conftest.py: runs after the tier's shared session
EPOCHS = 2


def spark_defaults(cluster: StandaloneCluster, s3: SharedS3) -> str:
    """spark-defaults.conf for a driver in the root namespace, reachable on the bridge."""
    conf = {
        "spark.driver.host": cluster.hosts.gateway,
        "spark.driver.bindAddress": cluster.hosts.gateway,
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.cores.max": str(HOSTS * EXECUTORS_PER_HOST),
        "spark.pyspark.python": sys.executable,
        # The ranks reach the shared store the way any S3 client is pointed at one.
        **{f"spark.executorEnv.{key}": value for key, value in s3.env.items()},
    }
    return "".join(f"{key} {value}\n" for key, value in conf.items())


def test_the_digits_job_trains_on_both_hosts_with_checkpoints_on_s3(cluster, cluster_s3, tmp_path):
    stop_active_session(cluster_conf(cluster))
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(spark_defaults(cluster, cluster_s3))
    bucket = cluster_s3.new_bucket("digits")
    env = {
        **os.environ,
        "SPARK_CONF_DIR": str(conf_dir),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
        **cluster_s3.env,
    }
    command = [
        sys.executable,
        "-m",
        "sparktrain.examples.digits",
        "--master",
        cluster.master_url,
        "--np",
        str(HOSTS * EXECUTORS_PER_HOST),
        "--epochs",
        str(EPOCHS),
        "--checkpoint-dir",
        f"s3://{bucket}/digits",
        "--out-dir",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f"Spark: started {cluster.master_url}" in output
    assert "4 ranks on Spark executors" in output
    accuracy = re.search(r"Test accuracy ([\d.]+)% after 2 epochs", output)
    assert accuracy and float(accuracy.group(1)) > 80, output
    stored = cluster_s3.fs().find(bucket)
    steps = {m.group(1) for path in stored if (m := re.search(r"step-0*(\d+)", path))}
    assert steps == {"1", "2"}, stored
    assert (Path(tmp_path) / "out" / "digits-history.png").exists()
