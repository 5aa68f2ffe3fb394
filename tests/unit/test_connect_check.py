"""The pure pieces of the Spark Connect path: static slots, version comparison, the records a
detached or first-stage task raises, what the client makes of them, and the session conf."""

from __future__ import annotations

import json

import pytest

from sparktrain.driver.connect_check import static_slots
from sparktrain.errors import WorkerFailure
from sparktrain.task.connect_stage import FAILURE_END, FAILURE_MARK, failure_in, mismatches


@pytest.mark.parametrize(
    "conf, slots",
    [
        ({"spark.master": "local[4]"}, 4),
        ({"spark.master": "local"}, 1),
        ({"spark.master": "local[*]"}, None),
        ({"spark.master": "local[3, 2]"}, 3),
        ({"spark.master": "local-cluster[2,1,1024]"}, 2),
        ({"spark.master": "local-cluster[3, 2, 1024]", "spark.task.cpus": "2"}, 3),
        (
            {
                "spark.master": "yarn",
                "spark.executor.instances": "4",
                "spark.executor.cores": "2",
            },
            8,
        ),
        (
            {
                "spark.master": "k8s://x",
                "spark.executor.instances": "4",
                "spark.executor.cores": "2",
                "spark.dynamicAllocation.enabled": "true",
            },
            None,
        ),
        ({"spark.master": "spark://h:7077"}, None),
        ({}, None),
    ],
)
def test_static_slots(conf, slots):
    assert static_slots(conf) == slots


def test_mismatches_name_each_differing_version():
    client = {"python": "3.11", "cloudpickle": "3.1.1", "torch": "2.13.0", "sparktrain": "0.1.0"}
    executor = client | {"torch": "2.12.0", "python": "3.12"}
    executor.pop("sparktrain")
    assert mismatches(client, executor) == [
        "python: client 3.11, executors 3.12",
        "torch: client 2.13.0, executors 2.12.0",
        "sparktrain: client 0.1.0, executors missing",
    ]
    assert mismatches(client, dict(client)) == []


def test_failure_record_survives_the_job_error_text():
    import base64

    failure = WorkerFailure(rank=1, exc_type="RuntimeError", message="boom", time=1.0).to_json()
    encoded = base64.b64encode(json.dumps(failure).encode()).decode()
    text = f"Job aborted ...\nRuntimeError: a rank failed {FAILURE_MARK}{encoded}{FAILURE_END}\n"
    assert failure_in(text) == failure
    assert failure_in("a job error without a record") is None
    assert failure_in(f"{FAILURE_MARK}not base64!{FAILURE_END}") is None


class FakeConf:
    def __init__(self, values, get_all=True):
        self.values = values
        self.get_all = get_all

    @property
    def getAll(self):  # noqa: N802 - pyspark's name
        if not self.get_all:
            raise AttributeError("getAll")
        return dict(self.values)

    def get(self, key, default=None):
        return self.values.get(key, default)


class FakeSession:
    def __init__(self, conf):
        self.conf = conf


@pytest.mark.parametrize("get_all", [True, False])
def test_sparktrain_conf_reads_only_our_keys(get_all):
    from sparktrain.driver.launch.connect import session_conf, sparktrain_conf

    values = {"spark.sparktrain.timeout": "5m", "spark.master": "local[2]"}
    conf = session_conf(FakeSession(FakeConf(values, get_all)))
    # With getAll, one snapshot answers every later read; without, the conf itself.
    assert isinstance(conf, dict) == get_all
    assert conf.get("spark.master", None) == "local[2]" and conf.get("x", "d") == "d"
    found = sparktrain_conf(conf, ["spark.sparktrain.timeout"])
    assert found == {"spark.sparktrain.timeout": "5m"}


LOCAL_CLUSTER = {"spark.master": "local-cluster[2,1,1024]"}


@pytest.mark.parametrize("setting, reachable", [(None, True), (True, True), (False, False)])
def test_the_plan_is_made_without_a_job_and_left_to_the_first_stage(setting, reachable):
    from sparktrain.config import RunConfig
    from sparktrain.driver.connect_check import plan_connect

    # The fake session has no range(): a plan that ran a job would fail here.
    config = RunConfig(np=2, client_address="10.1.2.3", client_reachable=setting)
    plan = plan_connect(FakeSession(FakeConf(LOCAL_CLUSTER)), config)
    assert (plan.address, plan.reachable, plan.slots, plan.checked) == (
        "10.1.2.3",
        reachable,
        2,
        False,
    )


def first_stage_failed(found: dict) -> RuntimeError:
    """The error a Connect client gets when a first stage's task raised what it ``found``."""
    from sparktrain.task import connect_stage

    with pytest.raises(RuntimeError) as info:
        connect_stage._raise_check(found)
    return RuntimeError(f"[TASK_FAILED] Job aborted ...\nPythonException: {info.value}\n")


def test_a_version_the_executors_differ_in_is_refused_and_named_once():
    from sparktrain.driver.connect_check import stage_verdict
    from sparktrain.errors import ConfigurationError
    from sparktrain.task.connect_stage import versions

    line = f"torch: client {versions()['torch']}, executors 1.0.0"
    verdict = stage_verdict(first_stage_failed({"versions": [line, line]}))
    assert isinstance(verdict, ConfigurationError)
    assert str(verdict).count(line) == 1
    assert "install the same versions on both sides" in str(verdict)


def test_another_python_on_the_executors_is_refused_with_the_way_out():
    from sparktrain.driver.connect_check import stage_verdict
    from sparktrain.errors import ConfigurationError

    text = "[PYTHON_VERSION_MISMATCH] Python in worker has different version (3, 12) than that in driver 3.11"
    verdict = stage_verdict(RuntimeError(f"Job aborted\n{text}\n"))
    assert isinstance(verdict, ConfigurationError)
    assert "different version (3, 12)" in str(verdict)
    assert "use the same Python on both sides" in str(verdict)


def test_other_stage_errors_mean_nothing_for_the_session():
    from sparktrain.driver.connect_check import stage_verdict

    assert stage_verdict(RuntimeError("Job aborted: a rank failed")) is None
    # A user's own error in the first stage, saying "different version", is not Spark's.
    assert stage_verdict(RuntimeError("ValueError: checkpoint has a different version")) is None
    # Spark's words without the error class (pyspark before 3.5) still are.
    spark = "Python in worker has different version 3.12 than that in driver 3.11"
    assert stage_verdict(RuntimeError(spark)) is not None
    assert stage_verdict(first_stage_failed({})) is None


def test_a_client_not_reached_makes_the_session_detached_with_a_warning(caplog):
    import logging

    from sparktrain.config import RunConfig
    from sparktrain.driver.connect_check import (
        ClientUnreachable,
        ConnectPlan,
        stage_verdict,
        unreached_plan,
    )

    verdict = stage_verdict(first_stage_failed({"unreached": "10.1.2.3:4 timed out"}))
    assert isinstance(verdict, ClientUnreachable)
    plan = ConnectPlan(address="10.1.2.3", reachable=True, slots=2)
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        after = unreached_plan(plan, RunConfig(np=2), verdict)
    assert (after.reachable, after.checked, after.slots) == (False, True, 2)
    assert "executors cannot reach this client at 10.1.2.3 (10.1.2.3:4 timed out)" in caplog.text


def test_a_client_said_to_be_reachable_but_not_reached_is_an_error():
    from sparktrain.config import RunConfig
    from sparktrain.driver.connect_check import ClientUnreachable, ConnectPlan, unreached_plan
    from sparktrain.errors import ConfigurationError

    plan = ConnectPlan(address="10.1.2.3", reachable=True)
    with pytest.raises(ConfigurationError, match="spark.sparktrain.clientReachable says they can"):
        unreached_plan(plan, RunConfig(np=2, client_reachable=True), ClientUnreachable("no"))


def first_stage_task(job) -> Exception:
    """What a first stage's task raises, run here with a stand-in Arrow input."""
    from sparktrain.task.connect_stage import run_connect_task

    with pytest.raises(RuntimeError) as info:
        next(run_connect_task(job, iter([object()])))
    return info.value


def a_first_stage_job(channel: str, client_versions: dict):
    from sparktrain.config import RunConfig
    from sparktrain.task.assignment import TaskJob

    config = RunConfig(np=2, start_timeout=60).to_json()
    return TaskJob("r", 0, config, channel, b"k" * 32, b"", client_versions=client_versions)


def test_a_task_whose_versions_differ_says_so_before_anything_starts():
    from sparktrain.task.connect_stage import check_in, versions

    claimed = versions() | {"cloudpickle": "0.0.1"}
    error = first_stage_task(a_first_stage_job("127.0.0.1:1", claimed))
    mine = versions()["cloudpickle"]
    assert check_in(str(error)) == {"versions": [f"cloudpickle: client 0.0.1, executors {mine}"]}


@pytest.mark.parametrize("where", ["255.255.255.255", "refused"])
def test_a_task_that_cannot_reach_the_client_says_so_at_once(where):
    import socket
    import time

    from sparktrain.task.connect_stage import REACH_TIMEOUT, check_in, versions

    if where == "refused":  # a port nothing listens on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            where = f"127.0.0.1:{sock.getsockname()[1]}"
    else:
        where += ":7077"
    start = time.monotonic()
    error = first_stage_task(a_first_stage_job(where, versions()))
    found = check_in(str(error))
    assert found is not None and where in found["unreached"]
    # Not the run's start_timeout (60 s): at most the reach time.
    assert time.monotonic() - start < REACH_TIMEOUT + 1
