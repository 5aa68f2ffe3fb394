"""The pure pieces of the Spark Connect path: static slots, version comparison, the failure
record a detached task raises, and the session conf."""

from __future__ import annotations

import json

import pytest

from sparktrain.driver.connect_check import mismatches, static_slots
from sparktrain.errors import WorkerFailure
from sparktrain.task.connect import FAILURE_END, FAILURE_MARK, failure_in


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


@pytest.mark.parametrize(
    "np, slots, per_task, tasks", [(4, None, 1, 4), (4, 2, 1, 2), (4, None, 2, 2), (1, 8, 1, 1)]
)
def test_the_probe_runs_the_stages_tasks_within_the_promised_slots(np, slots, per_task, tasks):
    from sparktrain.config import RunConfig
    from sparktrain.driver.connect_check import probe_tasks

    assert probe_tasks(RunConfig(np=np), slots, per_task) == tasks


def probed(monkeypatch, found):
    """plan_connect on a local-cluster[2,1,1024] session whose probe tasks say ``found``."""
    from sparktrain.config import RunConfig
    from sparktrain.driver import connect_check

    asked = []

    def probe(session, address, timeout, tasks):
        asked.append(tasks)
        return [dict(each) for each in found]

    monkeypatch.setattr(connect_check, "_probe", probe)
    session = FakeSession(FakeConf({"spark.master": "local-cluster[2,1,1024]"}))
    plan = connect_check.plan_connect(session, RunConfig(np=2, client_address="127.0.0.1"))
    assert asked == [2]
    return plan


def test_a_run_is_detached_when_any_probe_task_cannot_reach_the_client(monkeypatch, caplog):
    import logging

    from sparktrain.task.connect import versions

    ok = versions() | {"reached": "yes", "pid": "1"}
    lost = versions() | {"reached": "no: timed out", "pid": "2"}
    assert probed(monkeypatch, [ok, ok]).reachable
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        plan = probed(monkeypatch, [ok, lost])
    assert not plan.reachable
    assert "executors cannot reach this client at 127.0.0.1 (no: timed out)" in caplog.text


def test_a_version_any_probe_task_differs_in_is_named_once(monkeypatch):
    from sparktrain.errors import ConfigurationError
    from sparktrain.task.connect import versions

    ok = versions() | {"reached": "yes"}
    other = ok | {"torch": "1.0.0"}
    with pytest.raises(ConfigurationError) as info:
        probed(monkeypatch, [ok, other, other])
    message = str(info.value)
    assert message.count(f"torch: client {versions()['torch']}, executors 1.0.0") == 1


def test_the_reach_listener_answers_every_task_connecting_at_once():
    """However many probe tasks connect at once, none is left on a full backlog (it would time
    out and be taken for unreachable)."""
    import socket
    import threading

    from sparktrain.driver.connect_check import REACH_TIMEOUT, _accepting

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = listener.getsockname()
        reached: list[bool] = []
        start = threading.Barrier(100)

        def task() -> None:
            start.wait()
            try:
                with socket.create_connection(address, timeout=REACH_TIMEOUT):
                    reached.append(True)
            except OSError:
                reached.append(False)

        with _accepting(listener):
            threads = [threading.Thread(target=task) for _ in range(100)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert reached.count(True) == 100
