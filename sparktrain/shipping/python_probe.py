"""The executors' Python: chosen where sparktrain can know it, checked where it cannot.

PySpark starts every Python worker with the interpreter its driver read when the
SparkContext was created (``sc.pythonExec``: ``PYSPARK_PYTHON``, or ``python3`` from the
executor's ``PATH``). From a virtual environment that is not activated (an IDE, a Jupyter
kernel, cron) that ``python3`` lacks sparktrain, and a run used to end in a Java trace of
hundreds of lines. So, for sparktrain's own jobs:

* ``spark.pyspark.python``, when set, names the interpreter (Spark documents it as taking
  precedence over ``PYSPARK_PYTHON``; a SparkSession started from a notebook reads it for
  nothing, as only ``spark-submit`` turns it into ``PYSPARK_PYTHON``);
* else an interpreter chosen through ``PYSPARK_PYTHON`` is used as it is;
* else, on a local master (``local``, ``local[N]``, ``local-cluster[...]``: every executor
  runs on this machine), the driver's own interpreter (``sys.executable``);
* else PySpark's default, ``python3``.

What the executors' environment and ``spark.executorEnv.*`` hold is fixed when the context
starts, but the interpreter is read by PySpark each time it wraps a Python function for a job:
an RDD's when its Java side is first built, a DataFrame's (``mapInArrow``, ``mapInPandas``, a
pandas or Arrow UDF) when the plan or the UDF's column is built. sparktrain sets it for its own
jobs only, every one of them through :func:`sparktrain_python` (or :func:`pin_python` /
:func:`pin_udf`, built on the same swap), and the user's other jobs keep the interpreter the
session was started with. A Spark Connect client cannot choose the server's Python: there,
nothing is pinned (a run checks the executors in its first stage instead).

Where the choice is not known to work (any master but a local one running this very
interpreter), :func:`check_executor_python` runs one small task before the barrier stage is
submitted: it imports sparktrain and torch on an executor, once per SparkContext and
interpreter, and a failure is one :class:`~sparktrain.errors.ConfigurationError` that names
``PYSPARK_PYTHON`` / ``spark.pyspark.python``, the interpreter the executor ran, and what it
could not import. The task tries pyarrow too: jobs over Arrow batches (the converter's,
``predict_udf``, ``from_dataframe``) check with ``data=True``, and are refused where it lacks it.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import os
import re
import shutil
import sys
import threading
import types
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

from sparktrain.errors import ConfigurationError
from sparktrain.shipping.spark_errors import describe_spark_error

_log = logging.getLogger(__name__)

PYSPARK_DEFAULT = "python3"
PROBE_TIMEOUT = 120.0
MODULES = ("sparktrain", "torch")
# What a job that hands Arrow batches to Python needs besides (mapInArrow, Arrow and pandas UDFs).
DATA_MODULES = ("pyarrow",)
# What a Spark task and its ranks import first: ``import sparktrain`` alone is lazy and needs
# none of sparktrain's dependencies (a checkout's folder on the path would pass it).
ENTRY_MODULES = ("sparktrain.task.entry", "sparktrain.worker.bootstrap")
_LOCAL_MASTER = re.compile(r"^local(?:\[[^\]]*\]|-cluster\[[^\]]*\])?$")

# Swapping ``sc.pythonExec`` while one of sparktrain's jobs wraps its function: one at a time
# (re-entrant: a block may build a job whose UDF pins again).
_SWAP = threading.RLock()
# SparkContext -> {interpreter: report}; a context that is stopped and made anew is probed again.
_CHECKED: weakref.WeakKeyDictionary[Any, dict[str, ProbeReport]] = weakref.WeakKeyDictionary()
_CHECKED_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ProbeReport:
    """What one executor's Python said about itself.

    Attributes:
        python: the interpreter Spark was told to start.
        found: ``sys.executable`` on the executor ("" when the task never ran).
        host: the executor's host name.
        version: the executor's Python version.
        modules: module name -> version, for each of :data:`MODULES` that imported.
        errors: module name -> ``"ErrorType: message"``, for each that did not.
        failure: why the task itself failed (no Python started, a version mismatch), or "".
        data_modules: as ``modules``, for :data:`DATA_MODULES`.
        data_errors: as ``errors``, for :data:`DATA_MODULES`.
    """

    python: str
    found: str = ""
    host: str = ""
    version: str = ""
    modules: dict[str, str] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    failure: str = ""
    data_modules: dict[str, str] = dataclasses.field(default_factory=dict)
    data_errors: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the task ran and every one of :data:`MODULES` imported."""
        return not self.failure and not self.errors and set(self.modules) == set(MODULES)

    @property
    def ok_for_data(self) -> bool:
        """True when, besides, every one of :data:`DATA_MODULES` imported."""
        return self.ok and not self.data_errors and set(self.data_modules) == set(DATA_MODULES)


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[N,F]``, ``local[*]`` or ``local-cluster[...]``."""
    return bool(_LOCAL_MASTER.match(master.strip()))


def executor_python(sc: Any) -> tuple[str, str]:
    """The interpreter sparktrain's jobs start on the executors, and what chose it.

    Args:
        sc: a classic SparkContext.

    Returns:
        ``(interpreter, source)``, source naming the setting (or the rule) it came from.
    """
    configured = sc.getConf().get("spark.pyspark.python", None)
    if configured:
        return str(configured), "spark.pyspark.python"
    current = str(getattr(sc, "pythonExec", PYSPARK_DEFAULT))
    if os.environ.get("PYSPARK_PYTHON") or current != PYSPARK_DEFAULT:
        return current, "PYSPARK_PYTHON"
    if is_local_master(sc.master):
        return sys.executable, "the driver's interpreter (local master, PYSPARK_PYTHON unset)"
    return current, "PySpark's default (PYSPARK_PYTHON unset: python3 from the executors' PATH)"


def _is_this_interpreter(python: str) -> bool:
    """``python`` names this very interpreter (the same path: a venv's ``python`` symlink and
    the base interpreter it points at are different environments, so links are not followed)."""
    path = python if os.sep in python else shutil.which(python)
    return path is not None and os.path.abspath(path) == os.path.abspath(sys.executable)


@contextlib.contextmanager
def _python_exec(sc: Any, python: str) -> Iterator[None]:
    """PySpark wraps Python functions with ``python`` inside this block."""
    with _SWAP:
        before = sc.pythonExec
        sc.pythonExec = python
        try:
            yield
        finally:
            sc.pythonExec = before


def classic_context(spark: Any) -> Any | None:
    """The SparkContext of a classic SparkSession (or ``spark`` itself when it is one); None
    for a Spark Connect session, whose client has no say in the executors' Python."""
    if hasattr(spark, "pythonExec"):
        return spark
    try:
        return spark.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext on the client
        return None


@contextlib.contextmanager
def sparktrain_python(
    spark: Any, *, check: bool = True, timeout: float = PROBE_TIMEOUT, data: bool = False
) -> Iterator[str | None]:
    """The Python functions PySpark wraps inside this block start the interpreter a run
    starts on the executors (:func:`executor_python`), not the session's default.

    Build the job inside the block (``rdd._jrdd``, ``df.mapInArrow(...)``, ``udf(column)``);
    it may run after it. The block holds a lock that other threads' pins wait for, so it
    should not wait for another thread's Spark job.

    Args:
        spark: a SparkSession or SparkContext; for Spark Connect the block changes nothing.
        check: first run :func:`check_executor_python` (where the interpreter is not known
            to work: a one-task job, once per SparkContext and interpreter).
        timeout: the check's, see :func:`probe`.
        data: the job hands Arrow batches to Python (``mapInArrow``, an Arrow or pandas UDF):
            the check requires pyarrow too.

    Yields:
        The interpreter pinned, or None for Spark Connect.

    Raises:
        ConfigurationError: the check found that the executors' Python cannot run
            sparktrain (or, with ``data``, lacks pyarrow): the message a run gives.
    """
    sc = classic_context(spark)
    if sc is None:
        yield None
        return
    python = executor_python(sc)[0]
    if check:
        check_executor_python(sc, timeout, data=data)
    with _python_exec(sc, python):
        yield python


def pin_udf(udf: Any, check: bool = True) -> Any:
    """``udf`` (a pandas or Arrow UDF) wrapped, when first applied to a column, inside
    :func:`sparktrain_python` for the session active then.

    PySpark wraps a UDF's function once, at its first call on a column, with the interpreter
    of that moment, and keeps it; so pinning that first call pins every use. A Spark Connect
    UDF, which PySpark wraps on the server, is returned unchanged. The check (``check``)
    requires pyarrow too: every such UDF hands Arrow batches to Python.

    Returns:
        ``udf`` itself.
    """
    inner = getattr(udf, "_unwrapped", udf)
    create = getattr(inner, "_create_judf", None)
    if create is None:
        return udf

    def create_pinned(*args: Any, **kwargs: Any) -> Any:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:  # PySpark starts a session for it: nothing chosen yet to pin
            return create(*args, **kwargs)
        with sparktrain_python(sc, check=check, data=True):
            return create(*args, **kwargs)

    inner._create_judf = create_pinned
    return udf


def pin_python(rdd: Any, sc: Any, python: str) -> None:
    """Make ``rdd``'s Python function start ``python`` on the executors.

    PySpark wraps the function (with the context's interpreter of that moment) when the RDD's
    Java side is first needed; building it here, with ``python`` set, fixes the choice for this
    RDD alone.
    """
    if python == getattr(sc, "pythonExec", None):
        return
    with _python_exec(sc, python):
        rdd._jrdd  # noqa: B018 - building it is the point


def _probe_task(iterator: Any) -> list[dict[str, Any]]:
    """Runs on an executor: which Python this is, and whether it imports sparktrain and torch
    (and pyarrow, which jobs over Arrow batches need)."""
    import importlib
    import socket
    import sys

    for _ in iterator:
        pass
    found: dict[str, Any] = {
        "found": sys.executable,
        "host": socket.gethostname(),
        "version": sys.version.split()[0],
        "modules": {},
        "errors": {},
        "data_modules": {},
        "data_errors": {},
    }
    for name, first, kind in (
        ("sparktrain", ENTRY_MODULES, ""),
        ("torch", (), ""),
        ("pyarrow", (), "data_"),
    ):
        try:
            for needed in first:
                importlib.import_module(needed)
            module = importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - any failure is what is reported
            found[f"{kind}errors"][name] = f"{type(exc).__name__}: {exc}"
        else:
            found[f"{kind}modules"][name] = str(getattr(module, "__version__", "unknown"))
    return [found]


def _shipped_by_value() -> Any:
    """:func:`_probe_task` cut loose from this module, so that PySpark pickles its code rather
    than a reference to sparktrain, which the executor may be unable to import."""
    names = {"__builtins__": builtins, "ENTRY_MODULES": ENTRY_MODULES}
    return types.FunctionType(_probe_task.__code__, names, "probe")


def probe(sc: Any, python: str, timeout: float = PROBE_TIMEOUT) -> ProbeReport | None:
    """Run one task with ``python`` on an executor and report what it found (cached per
    SparkContext and interpreter).

    Args:
        sc: a classic SparkContext.
        python: the interpreter to start.
        timeout: how long the task may wait for a slot and run; it is then cancelled.

    Returns:
        The report, or None when the task did not end within ``timeout`` (not cached).
    """
    with _CHECKED_LOCK:
        known = _CHECKED.get(sc, {}).get(python)
    if known is not None:
        return known
    ended = threading.Event()
    outcome: list[Any] = []
    group = f"sparktrain-python-probe-{uuid.uuid4().hex[:12]}"

    def body() -> None:
        try:
            sc.setJobGroup(group, "sparktrain: the executors' Python", interruptOnCancel=True)
            rdd = sc.parallelize([0], 1).mapPartitions(_shipped_by_value())
            pin_python(rdd, sc, python)
            outcome.append(rdd.collect())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            outcome.append(exc)
        finally:
            ended.set()

    try:
        from pyspark import InheritableThread as Thread
    except ImportError:  # pragma: no cover - pyspark < 3.2
        Thread = threading.Thread  # type: ignore[misc,assignment]  # noqa: N806
    Thread(target=body, name="sparktrain-python-probe", daemon=True).start()
    if not ended.wait(timeout):
        with contextlib.suppress(Exception):
            sc.cancelJobGroup(group)
        _log.warning(
            "could not check the executors' Python (%s): its one task did not end within %.0f s",
            python,
            timeout,
        )
        return None
    report = _report(python, outcome[0])
    with _CHECKED_LOCK:
        _CHECKED.setdefault(sc, {})[python] = report
    return report


def _report(python: str, outcome: Any) -> ProbeReport:
    if isinstance(outcome, BaseException):
        return ProbeReport(python=python, failure=describe_spark_error(outcome))
    found = outcome[0]
    return ProbeReport(
        python=python,
        found=found["found"],
        host=found["host"],
        version=found["version"],
        modules=dict(found["modules"]),
        errors=dict(found["errors"]),
        data_modules=dict(found.get("data_modules", {})),
        data_errors=dict(found.get("data_errors", {})),
    )


def describe_failure(report: ProbeReport, source: str, data: bool = False) -> str:
    """The one message for an executor Python that cannot run sparktrain (with ``data``,
    sparktrain's jobs over Arrow batches, which need pyarrow too)."""
    needed = "sparktrain, torch and pyarrow" if data else "sparktrain and torch"
    if report.failure:
        what = f"Spark could not run a Python task with it: {report.failure}"
    else:
        errors = {**report.errors, **(report.data_errors if data else {})}
        missing = "; ".join(f"{name} ({error})" for name, error in errors.items())
        what = (
            f"on {report.host} it started {report.found} (Python {report.version}), which "
            f"cannot import {missing}"
        )
    return (
        f"the executors' Python cannot run sparktrain: {report.python} (from {source}); "
        f"{what}. Set PYSPARK_PYTHON (before the SparkSession starts) or spark.pyspark.python "
        f"to an interpreter that has {needed} on every executor (this driver runs "
        f"{sys.executable}), or install them into the executors' Python"
    )


def check_executor_python(
    sc: Any, timeout: float = PROBE_TIMEOUT, *, data: bool = False
) -> ProbeReport | None:
    """Refuse a run whose executors' Python cannot import sparktrain and torch (with
    ``data``, a job over Arrow batches whose executors' Python cannot import pyarrow too).

    A local master running this very interpreter is known to work and is not probed; anything
    else is, once per SparkContext and interpreter.

    Args:
        sc: a classic SparkContext.
        timeout: see :func:`probe`; when the probe cannot run in time, the run goes on.
        data: require :data:`DATA_MODULES` too (one probe answers both: its report is cached).

    Returns:
        The probe's report, or None when nothing was probed.

    Raises:
        ConfigurationError: the executor's Python failed to start or to import sparktrain or
            torch (or pyarrow, with ``data``); the message names the settings, the interpreter
            found and the import error.
    """
    python, source = executor_python(sc)
    if is_local_master(sc.master) and _is_this_interpreter(python):
        return None
    report = probe(sc, python, timeout)
    if report is not None and not (report.ok_for_data if data else report.ok):
        raise ConfigurationError(describe_failure(report, source, data))
    return report
