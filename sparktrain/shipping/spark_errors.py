"""The one useful line of a Spark job failure: the Python error inside it, with a hint."""

from __future__ import annotations

import re

_PY_ERROR = re.compile(r"^((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt)): (.*)$")
_JVM_ERROR = re.compile(
    r"^(?:Caused by: )?((?:java|javax|org\.apache)\.[\w.$]*(?:Exception|Error)): (.+)$"
)
_JVM_PACKAGES = ("org.", "java.", "javax.", "scala.", "py4j.", "io.netty.")


def describe_spark_error(error: BaseException) -> str:
    """The useful line of a Spark job failure: the Python error inside it, with a hint."""
    lines = str(error).splitlines()
    python_errors = [
        m for m in map(_PY_ERROR.match, lines) if m and not m.group(1).startswith(_JVM_PACKAGES)
    ]
    spark_reason = next(
        (line.split("SparkException: ", 1)[1] for line in lines if "SparkException: " in line), None
    )
    if python_errors:
        found = python_errors[-1]
        text = f"a task failed with {found.group(1)}: {found.group(2).strip()}"
        if found.group(1) == "ModuleNotFoundError" and "'sparktrain" in found.group(2):
            text += (
                " (sparktrain must be installed in the executors' Python: set "
                "PYSPARK_PYTHON / spark.pyspark.python to an interpreter that has it)"
            )
        return text
    java_errors = [
        m for m in map(_JVM_ERROR.match, lines) if m and "SparkException" not in m.group(1)
    ]
    # A barrier stage's own reason only says that a task failed; the JVM error says why.
    generic = spark_reason is None or "failed barrier" in spark_reason
    if java_errors and generic:
        found = java_errors[0]
        text = f"a task failed with {found.group(1)}: {found.group(2).strip()[:500]}"
        if "Cannot run program" in found.group(2):
            text += (
                " (PYSPARK_PYTHON / spark.pyspark.python must name an interpreter that "
                "exists on every executor, by absolute path)"
            )
        return text
    if spark_reason:
        return f"the Spark job failed: {spark_reason.strip()[:500]}"
    first = lines[0] if lines else type(error).__name__
    return f"the Spark job failed: {first[:500]}"
