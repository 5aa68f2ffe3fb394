"""describe_spark_error: the one useful line of a Py4J / Spark job failure."""

from __future__ import annotations

import pytest

from sparktrain.driver.launch.stage import describe_spark_error

JVM_FRAMES = """\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:784)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:766)
\tat org.apache.spark.scheduler.ResultTask.runTask(ResultTask.scala:93)
\tat java.base/java.lang.Thread.run(Thread.java:840)
"""


def py4j_error(python_traceback: str, reason: str | None = None) -> Exception:
    """The str() of a Py4JJavaError from ``rdd.barrier().mapPartitions(...).collect()``."""
    reason = reason or (
        "Job aborted due to stage failure: Could not recover from a failed barrier "
        "ResultStage. Most recent failure reason: Stage failed because barrier task "
        "ResultTask(0, 1) finished unsuccessfully."
    )
    text = (
        "py4j.protocol.Py4JJavaError: An error occurred while calling "
        "z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        f": org.apache.spark.SparkException: {reason}\n"
        f"org.apache.spark.api.python.PythonException: {python_traceback}\n"
        f"{JVM_FRAMES}"
        "\n"
        "Driver stacktrace:\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
        "(DAGScheduler.scala:2856)\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.abortStage(DAGScheduler.scala:2792)\n"
        f"Caused by: org.apache.spark.api.python.PythonException: {python_traceback}\n"
        f"{JVM_FRAMES}"
    )
    return Exception(text)


MISSING_SPARKTRAIN = """Traceback (most recent call last):
  File "/opt/spark/python/lib/pyspark.zip/pyspark/worker.py", line 1231, in main
    func, profiler, deserializer, serializer = read_command(pickleSer, infile)
  File "/opt/spark/python/lib/pyspark.zip/pyspark/worker.py", line 1067, in read_command
    command = serializer._read_with_length(file)
  File "/opt/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 471, in loads
    return cloudpickle.loads(obj, encoding=encoding)
ModuleNotFoundError: No module named 'sparktrain'
"""

USER_ERROR = """Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/sparktrain/task/entry.py", line 290, in run_spark_task
    records = supervisor.run(spec, [mine], backend, shared)
  File "/tmp/ipykernel_1/123.py", line 4, in train
    raise ValueError("labels must be in [0, 10)")
ValueError: labels must be in [0, 10)
"""

CHAINED = """Traceback (most recent call last):
  File "/tmp/train.py", line 3, in load
    open("/data/x")
FileNotFoundError: [Errno 2] No such file or directory: '/data/x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/tmp/train.py", line 9, in train
    raise RuntimeError("cannot load the data set")
RuntimeError: cannot load the data set
"""


def test_missing_sparktrain_on_executors_gives_the_pyspark_python_hint() -> None:
    text = describe_spark_error(py4j_error(MISSING_SPARKTRAIN))
    assert text.startswith("a task failed with ModuleNotFoundError: No module named 'sparktrain'")
    assert "PYSPARK_PYTHON" in text and "spark.pyspark.python" in text
    assert "\n" not in text


def test_missing_sparktrain_submodule_gets_the_hint_too() -> None:
    tb = MISSING_SPARKTRAIN.replace("'sparktrain'", "'sparktrain.task'")
    assert "PYSPARK_PYTHON" in describe_spark_error(py4j_error(tb))


def test_other_missing_module_gets_no_sparktrain_hint() -> None:
    tb = MISSING_SPARKTRAIN.replace("'sparktrain'", "'torchvision'")
    text = describe_spark_error(py4j_error(tb))
    assert text == "a task failed with ModuleNotFoundError: No module named 'torchvision'"


def test_python_error_inside_the_job_is_extracted() -> None:
    text = describe_spark_error(py4j_error(USER_ERROR))
    assert text == "a task failed with ValueError: labels must be in [0, 10)"


def test_the_last_python_error_of_a_chain_wins() -> None:
    text = describe_spark_error(py4j_error(CHAINED))
    assert text == "a task failed with RuntimeError: cannot load the data set"


def test_java_exceptions_are_not_taken_for_python_errors() -> None:
    text = describe_spark_error(
        Exception(
            "py4j.protocol.Py4JJavaError: An error occurred while calling o57.collect.\n"
            ": org.apache.spark.SparkException: Job 3 cancelled part of cancelled job group "
            "sparktrain-0123456789ab-0\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
            "(DAGScheduler.scala:2856)\n"
            "Caused by: java.lang.InterruptedException: sleep interrupted\n"
            "java.lang.OutOfMemoryError: Java heap space\n"
        )
    )
    assert text == (
        "the Spark job failed: Job 3 cancelled part of cancelled job group "
        "sparktrain-0123456789ab-0"
    )


def test_plain_spark_reason() -> None:
    reason = (
        "Job aborted due to stage failure: Task 0 in stage 2.0 failed 1 times, most recent "
        "failure: Lost task 0.0 in stage 2.0 (TID 5) (10.0.0.3 executor 1): ExecutorLostFailure "
        "(executor 1 exited caused by one of the running tasks) Reason: Remote RPC client "
        "disassociated."
    )
    error = Exception(
        f"An error occurred while calling o99.collectAndServe.\n"
        f": org.apache.spark.SparkException: {reason}\n{JVM_FRAMES}"
    )
    assert describe_spark_error(error) == f"the Spark job failed: {reason}"


def test_long_spark_reason_is_cut() -> None:
    error = Exception("org.apache.spark.SparkException: " + "x" * 2000)
    text = describe_spark_error(error)
    assert text == "the Spark job failed: " + "x" * 500


def test_no_spark_reason_uses_the_first_line() -> None:
    error = ConnectionRefusedError("[Errno 111] Connection refused\nmore detail")
    assert describe_spark_error(error) == "the Spark job failed: [Errno 111] Connection refused"


def test_empty_message_uses_the_type_name() -> None:
    assert describe_spark_error(KeyboardInterrupt()) == "the Spark job failed: KeyboardInterrupt"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("MyCustomError: odd: colons: inside", "MyCustomError: odd: colons: inside"),
        ("KeyboardInterrupt: stop", "KeyboardInterrupt: stop"),
        ("StopIteration_Exception: x", "StopIteration_Exception: x"),
        (
            "OSError: [Errno 28] No space left on device",
            "OSError: [Errno 28] No space left on device",
        ),
    ],
)
def test_python_error_line_shapes(line: str, expected: str) -> None:
    tb = f'Traceback (most recent call last):\n  File "x.py", line 1, in f\n{line}\n'
    assert describe_spark_error(py4j_error(tb)) == f"a task failed with {expected}"


def test_bare_exception_is_extracted() -> None:
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nException: plain\n'
    assert describe_spark_error(py4j_error(tb)) == "a task failed with Exception: plain"


def test_module_qualified_python_exception_is_extracted() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/tmp/train.py", line 20, in train\n'
        "    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    text = describe_spark_error(py4j_error(tb))
    assert "OutOfMemoryError: CUDA out of memory" in text


def test_java_side_task_failure_is_named_with_a_hint() -> None:
    text = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover "
        "from a failed barrier ResultStage. Most recent failure reason: Stage failed because "
        "barrier task ResultTask(0, 1) finished unsuccessfully.\n"
        'java.io.IOException: Cannot run program ".venv/bin/python": error=2, No such file or '
        "directory\n"
        "\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)\n"
    )
    message = describe_spark_error(RuntimeError(text))
    assert message.startswith("a task failed with java.io.IOException: Cannot run program")
    assert "absolute path" in message
