"""The cluster side of resume_demo's elastic mode: a local-cluster Spark of its own, and an
operator that takes one of its executors away for good and later gives it back.

Everything here runs on the driver. The checks of :func:`local_cluster_problem` cost nothing
and run before Spark starts, so a Python whose pyspark cannot start a local-cluster master
hears why and what to do, not a JVM's trace.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sparktrain.errors import CapacityError, ConfigurationError, RunTimeoutError

MASTER = "local-cluster[2,1,1024]"  # two executor JVMs of one core and 1 GiB
EXECUTORS = 2
BACK = "host-back"  # the file the operator writes in the marks folder once the host is back


# --------------------------------------------------------------------------- before Spark


def spark_home() -> Path | None:
    """Where a local-cluster's executors start from: ``SPARK_HOME``, else pyspark's folder."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def local_cluster_problem() -> str | None:
    """Why this installation cannot start a ``local-cluster`` master, with the fix; None if
    it can (pyspark with its jars and ``bin/spark-submit``, and Java)."""
    home = spark_home()
    if home is None:
        return (
            f"--elastic starts a Spark of its own, but pyspark is not installed for "
            f"{sys.executable}: pip install 'sparktrain[spark]' (or pip install pyspark); "
            "the other modes (--np -2) need no Spark"
        )
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else None
    if not (java is not None and os.access(java, os.X_OK)) and shutil.which("java") is None:
        return (
            "--elastic starts a Spark of its own, which needs Java 17 or newer, and no 'java' "
            "was found: install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) "
            "or set JAVA_HOME"
        )
    where = "SPARK_HOME" if os.environ.get("SPARK_HOME") else "pyspark's folder"
    missing = [
        name
        for name, present in (
            ("bin/spark-submit", (home / "bin" / "spark-submit").is_file()),
            ("jars/spark-core_*.jar", any((home / "jars").glob("spark-core_*.jar"))),
        )
        if not present
    ]
    if missing:
        return (
            f"--elastic needs a {MASTER} master, whose driver and executors are JVMs started "
            f"from Spark's own files, but {where} ({home}) has no {' and no '.join(missing)} "
            "(a pyspark without its jars, such as pyspark-client, runs Spark Connect only): "
            "install the full package (pip install pyspark), or set SPARK_HOME to a Spark "
            "distribution; the other modes (--np -2) need no Spark"
        )
    return None


def active_session_problem() -> str | None:
    """Why the demo cannot start its own Spark in this process (one is active); else None."""
    if "pyspark.sql" not in sys.modules:
        return None  # pyspark not imported: no session
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        return None
    return (
        "--elastic takes an executor away and gives it back, so it starts a Spark of its own, "
        f"but this process has an active SparkSession ({active.sparkContext.master}): run the "
        "demo in a process of its own (python -m sparktrain.examples.resume_demo --elastic), "
        "or stop that session first (spark.stop())"
    )


def check_local_cluster() -> None:
    """Refuse, before anything starts, where the demo's own local-cluster cannot run.

    Raises:
        ConfigurationError: what is missing (or in the way), and what to do.
    """
    problem = local_cluster_problem() or active_session_problem()
    if problem is not None:
        raise ConfigurationError(problem)


def start_session(limit: float) -> Any:
    """A quiet SparkSession on :data:`MASTER`, once all its executors have registered.

    An elastic run starts with the free task slots there are, so the demo starts it only
    once both executors are up.

    Raises:
        CapacityError: they did not register within ``limit`` seconds (the session is
            stopped).
    """
    from sparktrain.examples._common import spark_session

    started = time.monotonic()
    session, _ = spark_session(MASTER, "sparktrain-resume-demo-elastic")
    try:
        sc = session.sparkContext
        wait_until(sc, lambda: len(executor_ids(sc)) >= EXECUTORS, limit, "the executors")
    except BaseException:
        session.stop()
        raise
    print(
        f"Spark: started {MASTER} with {EXECUTORS} executors in {time.monotonic() - started:.1f} s",
        flush=True,
    )
    return session


# --------------------------------------------------------------------------- beside the run


class Operator:
    """Plays the cluster beside the run: takes an executor away for good, then gives it back.

    It follows rank 0's reports: once one says ``holding`` (the first attempt waits in the
    middle of an epoch) it takes the last executor away; ``away`` seconds after a smaller
    attempt's first report of a checkpoint (``saved``) it asks for the executors again, and
    once they are registered writes :data:`BACK` in ``marks``.

    Args:
        session: the demo's SparkSession, on a local-cluster master.
        marks: the folder where the ranks look for :data:`BACK`.
        away: seconds the host stays away.
        limit: the most seconds each of its waits lasts.
    """

    def __init__(self, session: Any, marks: str, away: float, limit: float) -> None:
        self._sc = session.sparkContext
        self.marks, self.away, self.limit = Path(marks), away, limit
        self.error: BaseException | None = None
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handle: Any) -> None:
        """Follow the run of ``handle`` (a :class:`~sparktrain.driver.handle.RunHandle`)."""
        self._thread = threading.Thread(
            target=self._play, args=(handle,), name="sparktrain-demo-operator", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """The run has ended: stop waiting, and let the thread end."""
        self._ended.set()
        if self._thread is not None:
            self._thread.join(self.limit)

    def _play(self, handle: Any) -> None:
        try:
            holding = self._await(
                handle,
                lambda r: r["attempt"] == 0 and r.get("holding"),
                "the first attempt to reach the middle of epoch 1",
            )
            if not holding:
                return
            self._take()
            smaller = self._await(
                handle,
                lambda r: r["attempt"] > 0 and r["size"] < EXECUTORS and r.get("saved"),
                "the smaller attempt's first checkpoint",
            )
            if not smaller or self._ended.wait(self.away):  # the host is away a while
                return
            self._give_back()
        except BaseException as exc:  # noqa: BLE001 - raised again on the driver's thread
            self.error = exc
            handle.cancel(wait=0)

    def _await(self, handle: Any, wanted: Callable[[dict[str, Any]], Any], what: str) -> bool:
        """Wait for a report of rank 0 that is ``wanted``; False when the run ended first."""
        deadline = time.monotonic() + self.limit
        seen = 0
        while True:
            rows = list(handle.record.reports) if handle.record is not None else []
            if any(wanted(flat_report(row)) for row in rows[seen:]):
                return True
            seen = len(rows)
            if handle.done():
                return False
            if time.monotonic() > deadline:
                raise RunTimeoutError(f"the demo waited {self.limit:g} s for {what}")
            if self._ended.wait(0.1):  # reports arrive on the run's thread, without an event
                return False

    def _take(self) -> None:
        victim = executor_ids(self._sc)[-1]
        print(
            f"[demo] taking executor {victim} away for good, as a preempted host vanishes "
            "(Spark does not replace it)",
            flush=True,
        )
        if not self._sc._jsc.sc().killExecutor(victim):
            raise CapacityError(f"Spark refused to take executor {victim} away")
        self._until(lambda: victim not in executor_ids(self._sc), f"executor {victim} to go")

    def _give_back(self) -> None:
        from sparktrain import private_dir

        if not request_executors(self._sc, EXECUTORS):
            raise CapacityError(f"Spark refused to run {EXECUTORS} executors again")
        print(f"[demo] the host is back after {self.away:g} s: Spark starts an executor on it")
        self._until(lambda: len(executor_ids(self._sc)) >= EXECUTORS, "the executor to register")
        private_dir.write_new(self.marks, BACK, b"")
        print(f"[demo] {EXECUTORS} executors again: a task slot is free to grow into", flush=True)

    def _until(self, condition: Callable[[], bool], what: str) -> None:
        wait_until(self._sc, condition, self.limit, what, self._ended)


def executor_ids(sc: Any) -> list[str]:
    """The ids of the executors registered with the driver now."""
    ids = sc._jsc.sc().getExecutorIds()
    return [str(ids.apply(i)) for i in range(ids.size())]


def request_executors(sc: Any, count: int) -> bool:
    """Ask the cluster manager for ``count`` executors in all (it starts the missing ones);
    False when it refuses."""
    no_hosts = getattr(sc._jvm.scala.collection.immutable, "Map$").__getattr__("MODULE$").empty()
    return bool(sc._jsc.sc().requestTotalExecutors(count, 0, no_hosts))


def wait_until(
    sc: Any,
    condition: Callable[[], bool],
    seconds: float,
    what: str,
    ended: threading.Event | None = None,
) -> None:
    """Wait for a change of the cluster's executors, at most ``seconds`` (or until ``ended``).

    Raises:
        CapacityError: it did not happen in time; names where the executors' logs are.
    """
    deadline = time.monotonic() + seconds
    while not condition():
        if ended is not None and ended.is_set():
            return
        if time.monotonic() > deadline:
            logs = (spark_home() or Path(".")) / "work" / sc.applicationId
            raise CapacityError(
                f"waited {seconds:g} s for {what}; the executors' logs are in {logs}"
            )
        time.sleep(0.2)  # executors come and go without an event Python can wait on


def flat_report(row: Mapping[str, Any]) -> dict[str, Any]:
    """A report of rank 0 as one mapping: its metrics as ints, with its step and epoch."""
    flat: dict[str, Any] = {k: int(v) for k, v in dict(row.get("metrics") or {}).items()}
    flat.update(step=row.get("step"), epoch=row.get("epoch"))
    flat.setdefault("attempt", -1)
    flat.setdefault("size", 0)
    return flat
