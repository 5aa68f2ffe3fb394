"""``sparktrain doctor --spark``: a local SparkSession, the executors' Python, a barrier stage.

It runs in a fresh interpreter with this environment as it is (``PYSPARK_PYTHON`` included),
so it sees what a run from this shell would: the interpreter sparktrain's jobs start on the
executors (see :mod:`sparktrain.shipping.python_probe`), then the same one-task probe a run
makes before its barrier stage (it imports sparktrain and torch there), then a 2-task barrier
stage with that interpreter.
"""

from __future__ import annotations

from sparktrain.commands import doctor_probes
from sparktrain.commands.doctor_probes import FAIL, OK, SKIP, SPARK_TIMEOUT, Check

SPARK_CODE = """
import dataclasses, json
from pyspark.sql import SparkSession
from sparktrain.shipping.python_probe import executor_python, pin_python, probe
spark = (SparkSession.builder.master("local[2]").appName("sparktrain-doctor")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .getOrCreate())
try:
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    python, source = executor_python(sc)
    found = {"version": spark.version, "python": python, "source": source}
    report = probe(sc, python, timeout=%(timeout)r)
    found["probe"] = None if report is None else dataclasses.asdict(report)
    if report is not None and report.ok:
        rdd = sc.parallelize(range(2), 2).barrier().mapPartitions(lambda it: [1])
        pin_python(rdd, sc, python)
        found["tasks"] = len(rdd.collect())
    print(json.dumps(found))
finally:
    spark.stop()
"""

SESSION_FIX = "check Java (above), and that the hostname resolves (export SPARK_LOCAL_IP=127.0.0.1)"


def check_spark_session(enabled: bool, pyspark_version: str | None) -> list[Check]:
    """When ``enabled``: a local[2] SparkSession starts, its executors' Python imports
    sparktrain and torch, and it runs a 2-task barrier stage."""
    if not enabled:
        return [Check("spark session", SKIP, "not tried (sparktrain doctor --spark starts one)")]
    if pyspark_version is None:
        return [Check("spark session", SKIP, "pyspark is not installed")]
    code = SPARK_CODE % {"timeout": SPARK_TIMEOUT / 2}
    data, text = doctor_probes._python_json(code, timeout=SPARK_TIMEOUT)
    if data is None:
        detail = f"a local[2] session failed: {doctor_probes._last_line(text)}"
        return [Check("spark session", FAIL, detail, SESSION_FIX, essential=True)]
    return [_python_row(data), _stage_row(data)]


def _python_row(data: dict) -> Check:
    from sparktrain.shipping.python_probe import ProbeReport, describe_failure

    python, source = data["python"], data["source"]
    if data.get("probe") is None:
        detail = f"{python} (from {source}): its one task did not end in time"
        return Check("spark python", FAIL, detail, SESSION_FIX, essential=True)
    report = ProbeReport(**data["probe"])
    if not report.ok:
        fix = (
            "set PYSPARK_PYTHON (before the SparkSession starts) or spark.pyspark.python to an "
            "interpreter with sparktrain and torch, or install them there"
        )
        return Check("spark python", FAIL, describe_failure(report, source), fix, essential=True)
    versions = ", ".join(f"{name} {version}" for name, version in report.modules.items())
    return Check("spark python", OK, f"executors run {report.found} (from {source}): {versions}")


def _stage_row(data: dict) -> Check:
    if data.get("tasks") == 2:
        detail = f"Spark {data['version']}: local[2] ran a 2-task barrier stage"
        return Check("spark session", OK, detail)
    if "tasks" not in data:
        return Check("spark session", SKIP, "no barrier stage tried: the executors' Python fails")
    detail = f"the barrier stage returned {data['tasks']} values"
    return Check("spark session", FAIL, detail, SESSION_FIX, essential=True)
