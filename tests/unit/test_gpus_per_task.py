"""Several GPUs per task (``spark.task.resource.gpu.amount=k``): each task runs k ranks, one
per GPU, and every rank's devices and place are right for ``cuda:{LOCAL_RANK}`` and
``hvd.local_rank()``. No Spark: the driver's checks, the layout and the task's slots."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sparktrain import SparkRunner, contract
from sparktrain.backends.base import rank_env
from sparktrain.config import RunConfig
from sparktrain.driver import capacity
from sparktrain.driver.capacity import check_capacity
from sparktrain.driver.launch.stage import failed_task
from sparktrain.driver.preflight import ranks_per_task
from sparktrain.errors import CapacityError, ConfigurationError
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec
from sparktrain.layout.rendezvous import view_of
from sparktrain.task.assignment import TaskJob
from sparktrain.task.connect_stage import DetachedSession
from sparktrain.task.entry import share
from tests.unit.test_capacity import FakeSc

GPUS = "spark.task.resource.gpu.amount"


class Conf:
    """A SparkConf's ``get`` and ``getAll`` over a dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - Spark's name
        return list(self.values.items())


class SubmitRefused(AssertionError):
    """Raised by the fake session if anything tries to reach Spark's scheduler."""


class FakeContext:
    """Only the conf: a run that reached the scheduler would fail with SubmitRefused."""

    master = "spark://master:7077"

    def __init__(self, conf: dict[str, str]) -> None:
        self._conf = Conf(conf)

    def getConf(self) -> Conf:  # noqa: N802
        return self._conf

    def __getattr__(self, name: str) -> Any:
        raise SubmitRefused(f"the run reached SparkContext.{name} before its checks")


class FakeSession:
    def __init__(self, conf: dict[str, str]) -> None:
        self.sparkContext = FakeContext(conf)


def _config(np: int, use_gpu: bool | None = None) -> RunConfig:
    return RunConfig(np=np, use_gpu=use_gpu)


# -- the driver: k, np and fractions ---------------------------------------------------------


@pytest.mark.parametrize(
    "conf, np, expected",
    [
        ({}, 3, 1),
        ({GPUS: "1"}, 3, 1),
        ({GPUS: "2"}, 4, 2),
        ({GPUS: "4.0"}, 8, 4),
        ({GPUS: "0"}, 3, 1),
    ],
)
def test_ranks_per_task_is_the_whole_gpu_amount(conf: dict, np: int, expected: int) -> None:
    assert ranks_per_task(Conf(conf), _config(np)) == expected


@pytest.mark.parametrize(
    "np, k, choices",
    [(3, 2, "Set np to 2 or 4"), (1, 2, "Set np to 2,"), (6, 4, "Set np to 4 or 8")],
)
def test_np_not_a_multiple_of_k_names_np_k_and_what_to_set(np: int, k: int, choices: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ranks_per_task(Conf({GPUS: str(k)}), _config(np))
    message = str(info.value)
    assert f"np={np} is not a multiple of {GPUS}={k}" in message
    assert f"runs {k} ranks, one per GPU" in message
    assert choices in message
    assert f"{GPUS}=1 for one rank per task" in message


def test_a_fraction_of_a_gpu_is_refused_unless_ranks_train_on_cpu() -> None:
    with pytest.raises(ConfigurationError) as info:
        ranks_per_task(Conf({GPUS: "0.5"}), _config(2))
    message = str(info.value)
    assert f"{GPUS}=0.5 gives tasks a fraction of a GPU" in message
    assert "use_gpu=False" in message and "whole number k" in message
    # On CPU the amount only limits how many tasks an executor runs: one rank per task.
    assert ranks_per_task(Conf({GPUS: "0.5"}), _config(2, use_gpu=False)) == 1


def test_a_gpu_amount_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=rf"{GPUS}='two' is not a number"):
        ranks_per_task(Conf({GPUS: "two"}), _config(2))


def test_the_runner_refuses_np_not_a_multiple_of_k_before_submitting() -> None:
    session = FakeSession({"spark.master": "spark://master:7077", GPUS: "2"})
    runner = SparkRunner(np=3, spark=session)
    with pytest.raises(ConfigurationError, match=rf"np=3 is not a multiple of {GPUS}=2"):
        runner.run(lambda: None)
    assert runner.last_run is None, "no attempt may start"


# -- the driver: slots count tasks -------------------------------------------------------------


def test_capacity_counts_tasks_not_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capacity, "POLL_INTERVAL", 0.01)
    # np=4 at 2 GPUs per task: 2 tasks, which 2 slots hold.
    check_capacity(FakeSc(slots=2), 2, wait=0.0, ranks_per_task=2)
    with pytest.raises(CapacityError) as info:
        check_capacity(FakeSc(slots=1), 2, wait=0.0, ranks_per_task=2)
    message = str(info.value)
    assert "np=4 (2 tasks of 2 ranks, one per GPU) needs 2 task slots" in message
    assert "the cluster has 1" in message
    assert "Lower np to 2 or less" in message


def test_a_failed_spark_task_is_named_by_its_first_slot() -> None:
    error = RuntimeError(
        "Job aborted: Lost task 1.0 in stage 3.0 (TID 7) (198.18.1.12 executor 2): boom"
    )
    found = failed_task(error, ranks_per_task=2)
    assert found is not None
    assert (found.index, found.host, found.executor) == (2, "198.18.1.12", "2")
    assert failed_task(error).index == 1  # type: ignore[union-attr]


def test_the_stage_has_np_over_k_tasks() -> None:
    job = TaskJob("r", 0, RunConfig(np=4).to_json(), "", b"", b"", ranks_per_task=2)
    assert job.tasks == 2


# -- the task: its slots ----------------------------------------------------------------------


def test_a_task_deals_one_gpu_to_each_slot() -> None:
    assert share(("0", "1"), 2) == [("0",), ("1",)]
    assert share(("3", "5", "6", "7"), 2) == [("3", "5"), ("6", "7")]
    assert share((), 2) == [(), ()]  # CPU, or UUIDs that could not be read
    assert share(("0",), 1) == [("0",)]


def _slots(host: str, first: int, gpus: tuple[str, ...], k: int) -> list[TaskInfo]:
    """The hellos of one task that holds ``gpus`` and runs ``k`` ranks (as run_spark_task)."""
    return [
        TaskInfo(index=first + s, host=host, port=9000 + first, gpus=own, slot=s)
        for s, own in enumerate(share(gpus, k))
    ]


def _envs(infos: list[TaskInfo], np: int) -> list[dict[str, str]]:
    spec = build_cluster_spec(infos)
    return [rank_env(spec, r, RunConfig(np=np)) for r in spec.ranks]


def test_two_hosts_one_task_of_two_gpus_each() -> None:
    infos = _slots("h1", 0, ("0", "1"), 2) + _slots("h2", 2, ("0", "1"), 2)
    spec = build_cluster_spec(infos)
    assert spec.master_port == 9000 and spec.master_addr == "h1"
    envs = _envs(infos, 4)
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2"] * 4
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    for env in envs:
        visible = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert visible == ["0", "1"]
        # cuda:{LOCAL_RANK} and the worker's own pinning pick the same, distinct GPU.
        assert env[contract.DEVICE_INDEX_ENV] == env["LOCAL_RANK"]


def test_two_tasks_of_two_gpus_on_one_host_get_four_distinct_devices() -> None:
    infos = _slots("h1", 0, ("0", "1"), 2) + _slots("h1", 2, ("2", "3"), 2)
    envs = _envs(infos, 4)
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0,1,2,3"}
    owns = [e["CUDA_VISIBLE_DEVICES"].split(",")[int(e["LOCAL_RANK"])] for e in envs]
    assert owns == ["0", "1", "2", "3"]
    assert [e[contract.DEVICE_INDEX_ENV] for e in envs] == ["0", "1", "2", "3"]


def test_containers_numbering_their_own_gpus_show_each_rank_its_tasks_gpus() -> None:
    # Two executors (containers) on one host, each with GPUs it numbers 0 and 1.
    infos = _slots("h1", 0, ("0", "1"), 2) + _slots("h1", 2, ("0", "1"), 2)
    envs = _envs(infos, 4)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1"] * 4
    assert [e[contract.DEVICE_INDEX_ENV] for e in envs] == ["0", "1", "0", "1"]


def test_use_gpu_false_hides_the_gpus_of_every_slot() -> None:
    infos = _slots("h1", 0, ("0", "1"), 2)
    spec = build_cluster_spec(infos)
    envs = [rank_env(spec, r, RunConfig(np=2, use_gpu=False)) for r in spec.ranks]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["", ""]


def test_slot_survives_the_hello() -> None:
    info = _slots("h1", 2, ("0", "1"), 2)[1]
    back = TaskInfo.from_json(info.to_json())
    assert back == info and (back.slot, back.first_index) == (1, 2)
    assert TaskInfo.from_json({"index": 3, "host": "h", "port": 1}).first_index == 3


def test_a_detached_task_gathers_every_slot_of_every_task() -> None:
    class Context:
        def __init__(self) -> None:
            self.sent: list[str] = []

        def allGather(self, text: str) -> list[str]:  # noqa: N802 - Spark's name
            self.sent.append(text)
            other = [json.loads(i.to_json()) for i in _slots("h2", 2, ("0", "1"), 2)]
            return [json.dumps(other), text]

    job = TaskJob("r", 0, RunConfig(np=4).to_json(), "", b"", b"", ranks_per_task=2)
    context = Context()
    session = DetachedSession(job, context)
    for info in _slots("h1", 0, ("0", "1"), 2):
        session.send({"type": "hello", "index": info.index, "info": json.loads(info.to_json())})
    go = session.wait_for_go()
    assert go is not None
    view = view_of(go)
    # Its own host's ranks, not every task's: the job's size is counted.
    assert [(r.rank, r.task.index, r.task.host, r.task.gpus) for r in view.spec.ranks] == [
        (0, 0, "h1", ("0",)),
        (1, 1, "h1", ("1",)),
    ]
    assert (view.spec.world_size, view.spec.num_nodes) == (4, 2)
    assert view.spec.node_sizes == (("h1", 2), ("h2", 2))  # it holds rank 0
    assert not view.probing  # no driver to choose: nothing is probed
