"""A real Spark Connect server for the tests: its own JVM, with two executor JVMs.

The server is pyspark's own (``spark-submit --class ...SparkConnectServer``, what
``sbin/start-connect-server.sh`` runs), started as a child of the tests in a session of its
own, on loopback, with the test cluster's conf; the client session has no JVM of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, spark_test_conf

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# Seconds for the server to listen (it takes 14-30 s on a busy 2-core machine).
SERVER_START = 180.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture(scope="package")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The ``sc://`` URL of a Spark Connect server on ``local-cluster[2,1,1024]``."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17+ is needed for Spark tests (install openjdk-17-jre-headless)")
    pyspark = pytest.importorskip("pyspark")
    for module in ("grpc", "grpc_status", "google.rpc", "zstandard"):
        pytest.importorskip(
            module,
            reason="Spark Connect's client needs grpcio, grpcio-status, "
            "googleapis-common-protos and zstandard (pip install 'sparktrain[connect]')",
        )
    home = Path(pyspark.__file__).resolve().parent
    port = _free_port()
    command = [
        str(home / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--name",
        "sparktrain-connect-tests",
        "--master",
        "local-cluster[2,1,1024]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.driver.host=127.0.0.1",
    ]
    for key, value in spark_test_conf().items():
        command += ["--conf", f"{key}={value}"]
    paths = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
    }
    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SERVER_START
        while not _listening(port):
            if proc.poll() is not None:
                pytest.fail(f"the Connect server exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the Connect server did not listen in {SERVER_START:g}s:\n{_tail(log)}"
                )
            time.sleep(0.2)  # polling a port that has no readiness event to wait on
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(proc)


@pytest.fixture(scope="package")
def connect(connect_server: str) -> Iterator[Any]:
    """A Spark Connect client session on :func:`connect_server` (no JVM in this process)."""
    from pyspark.sql.connect.session import SparkSession

    # The client marks the whole process as a Connect one: put that back for other tests.
    names = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    before = {name: os.environ.get(name) for name in names}
    session = SparkSession.builder.remote(connect_server).getOrCreate()
    try:
        # The first job of a fresh cluster starts its Python workers: keep that out of tests.
        session.range(2).collect()
        yield session
    finally:
        session.stop()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
