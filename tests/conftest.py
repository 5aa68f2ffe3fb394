"""Shared fixtures: one local-cluster SparkSession for the whole test session."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import shutil
import signal
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from sparktrain.config.conf_file import read_conf_file
from tests import fixtures
from tests.helpers import remove_fake_gpus, time_calls_only

pytest_plugins = ["tests.tier_times"]
if importlib.util.find_spec("xdist") is not None:
    pytest_plugins.append("tests.workers")  # how ``-n 2`` shares the suite out (its hooks)

# Executors cannot import the tests package: ship every module of tests/fixtures by value.
# (Those modules import heavy libraries inside their functions only; stand-alone scripts the
# tests run live in tests/fixtures/scripts/, which is not a package and is not imported.)
for _module in pkgutil.iter_modules(fixtures.__path__):
    cloudpickle.register_pickle_by_value(importlib.import_module(f"tests.fixtures.{_module.name}"))

# A suite started in the background of a non-interactive shell (`cmd &`, nohup, some CI
# runners) inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt: the
# tests that press Ctrl-C check what a user in a terminal gets, so SIGINT acts as it does there.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
# How long the shared session waits for its two executors; its start is not counted in the
# time limit of the test whose setup it is (see pytest_collection_modifyitems).
EXECUTORS_WAIT_S = 240.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The shared session (``spark``) starts in the setup of each pytest process's first test
    that asks for it, under a limit of its own (EXECUTORS_WAIT_S): beside other suites that
    start, with the JVMs', took over two minutes, so the tests that use the session are timed
    from their own call (see time_calls_only)."""
    time_calls_only(config, items, lambda item: "spark" in getattr(item, "fixturenames", ()))


def spark_test_conf() -> dict[str, str]:
    """conf/spark-defaults.conf with {conf} filled in, plus this interpreter for executors."""
    conf = {
        key: value.replace("{conf}", str(CONF))
        for key, value in read_conf_file(CONF / "spark-defaults.conf").items()
    }
    conf["spark.pyspark.python"] = sys.executable
    conf["spark.pyspark.driver.python"] = sys.executable
    return conf


def _forget_earlier_sessions_conf() -> None:
    """Clear the ``spark.*`` JVM properties an earlier session of this process left.

    The session that launched this process's JVM passed its options as JVM system properties,
    and every later ``SparkConf`` loads them: after the cluster tier's session, its driver host
    (on a bridge that is gone), GPUs and memory would reach this session.
    """
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:
        return
    props = jvm.System.getProperties()
    for key in [str(k) for k in props.keySet()]:
        if key.startswith("spark."):
            jvm.System.clearProperty(key)


def wait_for_executors(session, count: int, seconds: float, logs) -> None:
    """Wait until ``count`` executors have registered with ``session``'s driver; a
    RuntimeError with ``logs()`` (what the executors printed) after ``seconds``."""
    deadline = time.monotonic() + seconds
    tracker = session.sparkContext._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) - 1 < count:  # the driver counts as one
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} executors did not register in {seconds:.0f} s:\n{logs()}")
        time.sleep(0.2)  # registration has no event Python can wait on


def _local_executor_logs(session) -> str:
    """The tail of each local-cluster executor's stderr (under SPARK_HOME/work/<app id>)."""
    import pyspark

    app = Path(pyspark.__file__).parent / "work" / session.sparkContext.applicationId
    tails = [
        f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        for log in sorted(app.glob("*/stderr"))
    ]
    return "\n".join(tails) or f"(no executor has written to {app} yet)"


@pytest.fixture(scope="session")
def spark():
    """A local-cluster[2,1,1024] session: two executor JVMs, one core and one fake GPU each."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java 17+ is needed for Spark tests (install openjdk-17-jre-headless)")
    pyspark_sql = pytest.importorskip("pyspark.sql")
    builder = pyspark_sql.SparkSession.builder.master("local-cluster[2,1,1024]").appName(
        "sparktrain-tests"
    )
    for key, value in spark_test_conf().items():
        builder = builder.config(key, value)
    _forget_earlier_sessions_conf()
    with pytest.MonkeyPatch.context() as patch:
        # Executors start "python3" from PATH unless told otherwise; they need this venv.
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        session = builder.getOrCreate()
        jvm_pid = session.sparkContext._jvm.ProcessHandle.current().pid()
        # The tests count on two slots from their first line: on a busy machine the executor
        # JVMs take longer to start than a run's capacity wait allows (it counts from the
        # session's start, as it should for a user), so the session is ready only with both.
        wait_for_executors(session, 2, EXECUTORS_WAIT_S, lambda: _local_executor_logs(session))
        yield session
        session.stop()
    remove_fake_gpus(jvm_pid)


@pytest.fixture(params=["local", "spark"])
def mode(request):
    """Run a test on the driver (np<0) and on Spark executors (np>0)."""
    if request.param == "spark":
        request.getfixturevalue("spark")
    return request.param


def ranks(mode: str, n: int) -> int:
    """The np argument that runs n ranks in ``mode``."""
    return -n if mode == "local" else n
