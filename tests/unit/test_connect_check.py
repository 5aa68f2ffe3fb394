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
