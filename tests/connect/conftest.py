"""A real Spark Connect server for the tests: its own JVM, with two executor JVMs.

The client session in the tests has no JVM of its own. The server and session are per
package: they end before the classic tier's tests start their own cluster.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, spark_test_conf
from tests.helpers import time_calls_only, under


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier's server starts in its first test's setup, under limits of its own (its start,
    its first job), which took over 300 s beside two other suites: see time_calls_only."""
    time_calls_only(config, items, under(Path(__file__).resolve().parent))


@pytest.fixture(scope="package")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The ``sc://`` URL of a Spark Connect server on ``local-cluster[2,1,1024]``."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17+ is needed for Spark tests (install openjdk-17-jre-headless)")
    pytest.importorskip("pyspark")
    for module in ("grpc", "grpc_status", "google.rpc", "zstandard"):
        pytest.importorskip(
            module,
            reason="Spark Connect's client needs grpcio, grpcio-status, googleapis-common-protos "
            "and zstandard (pip install 'sparktrain[connect]')",
        )
    from tests.connect.server import ServerFailed, connect_server

    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    try:
        with connect_server("local-cluster[2,1,1024]", spark_test_conf(), log, [str(ROOT)]) as url:
            yield url
    except ServerFailed as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="package")
def connect(connect_server: str) -> Iterator[Any]:
    """A Spark Connect client session on :func:`connect_server`."""
    from tests.connect.server import ServerFailed, connect_session, first_job

    with connect_session(connect_server) as session:
        # The first job of a fresh cluster starts its executors' work: keep that out of tests.
        try:
            first_job(session)
        except ServerFailed as exc:
            pytest.fail(str(exc))
        yield session
