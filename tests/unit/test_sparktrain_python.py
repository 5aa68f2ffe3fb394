"""sparktrain_python and pin_udf: the Python functions sparktrain's jobs wrap start the
interpreter a run chooses, checked first where it is not known to work."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sparktrain.errors import ConfigurationError
from sparktrain.shipping import python_probe
from sparktrain.shipping.python_probe import (
    PYSPARK_DEFAULT,
    ProbeReport,
    describe_failure,
    pin_udf,
    sparktrain_python,
)


class FakeContext:
    """A SparkContext's master, settings and the interpreter PySpark would wrap with."""

    def __init__(self, master: str, **conf: str) -> None:
        self.master = master
        self.pythonExec = PYSPARK_DEFAULT
        self.conf = {key.replace("_", "."): value for key, value in conf.items()}

    def getConf(self) -> Any:  # noqa: N802 - SparkContext's name
        return self.conf


class FakeSession:
    def __init__(self, sc: FakeContext) -> None:
        self.sparkContext = sc


class FakeConnectSession:
    """A Spark Connect session: no SparkContext on the client."""

    @property
    def sparkContext(self) -> Any:  # noqa: N802 - SparkSession's name
        raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext is not supported")


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)


def probing(monkeypatch: pytest.MonkeyPatch, **report: Any) -> list[str]:
    """The interpreters probed; each probe finds a Python on worker-1 as ``report`` says."""
    seen: list[str] = []

    def probe(sc: Any, python: str, timeout: float) -> ProbeReport:
        seen.append(python)
        return ProbeReport(
            python=python, found="/usr/bin/python3", host="worker-1", version="3.11.2", **report
        )

    monkeypatch.setattr(python_probe, "probe", probe)
    return seen


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The interpreters probed (each probe finds a Python that cannot import pyarrow's users)."""
    return probing(
        monkeypatch,
        modules={"torch": "2.13.0"},
        errors={"sparktrain": "ModuleNotFoundError: No module named 'sparktrain'"},
    )


NO_PYARROW = "ModuleNotFoundError: No module named 'pyarrow'"
CLUSTER_DEFAULT = "PySpark's default (PYSPARK_PYTHON unset: python3 from the executors' PATH)"


@pytest.fixture
def no_pyarrow(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The interpreters probed (each probe finds a Python with sparktrain and torch that
    cannot import pyarrow: enough for a run, not for a job over Arrow batches)."""
    return probing(
        monkeypatch,
        modules={"sparktrain": "0.9.0", "torch": "2.13.0"},
        errors={},
        data_errors={"pyarrow": NO_PYARROW},
    )


def _refusal_without_pyarrow() -> str:
    report = python_probe.probe(FakeContext("yarn"), "python3", 0)
    assert report is not None
    message = describe_failure(report, CLUSTER_DEFAULT, data=True)
    assert f"cannot import pyarrow ({NO_PYARROW})" in message
    assert "an interpreter that has sparktrain, torch and pyarrow on every executor" in message
    assert "Set PYSPARK_PYTHON (before the SparkSession starts)" in message
    return message


def test_a_python_without_pyarrow_runs_a_training_but_not_a_job_over_arrow_batches(
    unset: None, no_pyarrow: list[str]
) -> None:
    sc = FakeContext("yarn")
    with sparktrain_python(sc) as python:  # what a run's stage needs is there
        assert sc.pythonExec == python == "python3"
    built = []
    with pytest.raises(ConfigurationError) as info, sparktrain_python(sc, data=True):
        built.append(sc.pythonExec)
    assert str(info.value) == _refusal_without_pyarrow()
    assert built == []


def test_the_converters_jobs_refuse_a_python_without_pyarrow(
    unset: None, no_pyarrow: list[str], tmp_path: Any
) -> None:
    from sparktrain.data.converter import _probe_from_executors
    from sparktrain.data.task_writer import write_from_tasks

    # Neither fake has what building the job needs (range, mapInArrow): refused before it.
    session = FakeSession(FakeContext("yarn"))
    with pytest.raises(ConfigurationError) as probe_job:
        _probe_from_executors(session, tmp_path.as_uri(), "probe", "token", None)
    frame = types.SimpleNamespace(sparkSession=session)
    with pytest.raises(ConfigurationError) as writer_job:
        write_from_tasks(
            frame, (tmp_path / "cache").as_uri(), row_group_size_bytes=1 << 20, storage_options={}
        )
    assert str(probe_job.value) == str(writer_job.value) == _refusal_without_pyarrow()


def test_from_dataframe_refuses_a_python_without_pyarrow_before_the_run(
    unset: None, no_pyarrow: list[str]
) -> None:
    from pyspark.sql import types as sql

    from sparktrain.data import from_dataframe

    frame = types.SimpleNamespace(
        sparkSession=FakeSession(FakeContext("spark://10.0.0.1:7077")),
        schema=sql.StructType([sql.StructField("x", sql.DoubleType())]),
        columns=["x"],
        repartition=None,
    )
    with pytest.raises(ConfigurationError) as info:
        from_dataframe(frame, batch_size=4)
    assert no_pyarrow == ["python3"]  # checked once, at the call
    assert str(info.value) == _refusal_without_pyarrow()


def test_predict_udf_refuses_a_python_without_pyarrow_at_its_first_column(
    monkeypatch: pytest.MonkeyPatch, unset: None, no_pyarrow: list[str]
) -> None:
    import torch
    from pyspark import SparkContext

    from sparktrain.inference import predict_udf

    class TypedContext(FakeContext):
        """PySpark reads a UDF's return type (DDL) through the active context's JVM."""

        _jvm = object()

        def _parse_ddl(self, ddl: str) -> Any:
            from pyspark.sql.types import DoubleType

            assert ddl == "double"
            return DoubleType()

    sc = TypedContext("yarn")
    monkeypatch.setattr(SparkContext, "_active_spark_context", sc)
    regress = predict_udf(torch.nn.Linear(2, 1), task="regression")
    with pytest.raises(ConfigurationError) as info:
        regress._unwrapped._judf  # noqa: B018 - what PySpark reads when the UDF meets a column
    assert str(info.value) == _refusal_without_pyarrow()
    assert sc.pythonExec == PYSPARK_DEFAULT


def test_the_executor_task_reports_pyarrow_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's task, run here: pyarrow is reported beside sparktrain and torch, and its
    absence fails a job over Arrow batches, not a run."""
    found = python_probe._report("python3", python_probe._probe_task(iter([0])))
    assert found.ok and found.ok_for_data
    assert found.data_modules == {"pyarrow": pa.__version__}
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails
    found = python_probe._report("python3", python_probe._probe_task(iter([0])))
    assert found.ok and not found.ok_for_data
    assert found.data_errors["pyarrow"].startswith("ModuleNotFoundError: import of pyarrow")


def test_a_local_master_wraps_with_this_interpreter_inside_the_block_only(
    unset: None, probes: list[str]
) -> None:
    sc = FakeContext("local-cluster[1,1,1024]")
    with sparktrain_python(FakeSession(sc)) as python:
        inside = sc.pythonExec
    assert (python, inside) == (sys.executable, sys.executable)
    assert sc.pythonExec == PYSPARK_DEFAULT  # the user's own jobs keep the session's
    assert probes == []  # this very interpreter on this machine: known to work


def test_the_interpreter_is_restored_when_the_block_fails(unset: None) -> None:
    sc = FakeContext("local[1]")
    with pytest.raises(ValueError, match="planning failed"), sparktrain_python(sc):
        raise ValueError("planning failed")
    assert sc.pythonExec == PYSPARK_DEFAULT


def test_a_cluster_whose_python_lacks_sparktrain_is_refused_before_the_job_is_built(
    unset: None, probes: list[str]
) -> None:
    sc = FakeContext("yarn")
    built = []
    with pytest.raises(ConfigurationError) as info, sparktrain_python(sc):
        built.append(sc.pythonExec)
    report = python_probe.probe(sc, "python3", 0)
    source = "PySpark's default (PYSPARK_PYTHON unset: python3 from the executors' PATH)"
    assert str(info.value) == describe_failure(report, source)  # the runner's message
    assert "Set PYSPARK_PYTHON (before the SparkSession starts)" in str(info.value)
    assert built == []
    assert probes[0] == "python3"


def test_the_setting_is_pinned_and_checked_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch, unset: None
) -> None:
    checked: list[str] = []
    monkeypatch.setattr(
        python_probe, "probe", lambda sc, python, timeout: checked.append(python)
    )  # None: the probe did not end in time, and the job goes on
    sc = FakeContext("spark://10.0.0.1:7077", spark_pyspark_python="/opt/env/bin/python")
    with sparktrain_python(sc) as python:
        inside = sc.pythonExec
    assert (python, inside, checked) == (
        "/opt/env/bin/python",
        "/opt/env/bin/python",
        ["/opt/env/bin/python"],
    )


def test_check_false_pins_without_probing(unset: None, probes: list[str]) -> None:
    sc = FakeContext("yarn", spark_pyspark_python="/opt/env/bin/python")
    with sparktrain_python(sc, check=False):
        assert sc.pythonExec == "/opt/env/bin/python"
    assert probes == []


def test_spark_connect_is_left_as_it_is(probes: list[str]) -> None:
    with sparktrain_python(FakeConnectSession()) as python:
        pass
    assert python is None
    assert probes == []


def identity(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
    yield from batches


def _arrow_udf() -> Any:
    """An Arrow UDF (a pandas one before PySpark 4.1), as spark_udf makes them."""
    from pyspark.sql.types import DoubleType

    try:
        from pyspark.sql.functions import arrow_udf
    except ImportError:
        from pyspark.sql.functions import PandasUDFType, pandas_udf

        return pandas_udf(lambda batches: batches, DoubleType(), PandasUDFType.SCALAR_ITER)
    return arrow_udf(identity, DoubleType())


def test_a_udf_is_wrapped_with_the_runs_interpreter_at_its_first_column(
    monkeypatch: pytest.MonkeyPatch, unset: None
) -> None:
    from pyspark import SparkContext

    sc = FakeContext("local[2]")
    monkeypatch.setattr(SparkContext, "_active_spark_context", sc)
    udf = _arrow_udf()
    wrapped_with: list[str] = []
    # PySpark's own _create_judf needs a JVM: this one notes the interpreter it would read.
    udf._unwrapped._create_judf = lambda func, *a, **k: wrapped_with.append(sc.pythonExec)
    assert pin_udf(udf) is udf
    udf._unwrapped._judf  # noqa: B018 - what PySpark reads when the UDF meets a column
    assert wrapped_with == [sys.executable]
    assert sc.pythonExec == PYSPARK_DEFAULT


def test_a_udf_without_a_python_side_wrapper_is_returned_as_it_is() -> None:
    class ConnectUDF:
        """PySpark's Connect UDFs are wrapped on the server: no _create_judf."""

    udf = ConnectUDF()
    assert pin_udf(udf) is udf
    assert vars(udf) == {}
