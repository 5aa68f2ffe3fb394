"""Several executors on one host that report the same GPU id (containers that each number
their GPUs from 0, a discovery script that numbers per executor): each rank gets a device list
torch understands, and one physical GPU given to two tasks is refused before any rank starts."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from sparktrain import contract
from sparktrain.backends.base import rank_env
from sparktrain.config import RunConfig
from sparktrain.driver.monitor import RunMonitor
from sparktrain.errors import ConfigurationError
from sparktrain.layout.cluster import (
    TaskInfo,
    build_cluster_spec,
    gpu_double_booking,
    shared_gpu_ids,
)
from sparktrain.task.gpus import uuids_for
from sparktrain.wire import protocol
from tests.unit.test_monitor import Done, FakeLaunch, FakeTask, server  # noqa: F401

SMI = "0, GPU-aaaa\n1, GPU-bbbb\n"


def _infos(*tasks: tuple[str, tuple[str, ...], tuple[str, ...]]) -> list[TaskInfo]:
    return [
        TaskInfo(index=i, host=h, port=7000 + i, gpus=g, gpu_uuids=u)
        for i, (h, g, u) in enumerate(tasks)
    ]


def test_ranks_of_executors_numbering_their_own_gpus_each_see_their_own() -> None:
    infos = _infos(("a", ("0",), ()), ("a", ("0",), ()), ("b", ("0",), ()))
    spec = build_cluster_spec(infos)
    config = RunConfig(np=3)
    for index in range(3):
        env = rank_env(spec, spec.for_task(index), config)
        # Not "0,0", which torch reads as no GPU at all.
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env[contract.DEVICE_INDEX_ENV] == "0"


def test_distinct_ids_on_a_host_keep_one_numbering() -> None:
    spec = build_cluster_spec(_infos(("a", ("0",), ()), ("a", ("1",), ())))
    envs = [rank_env(spec, spec.for_task(i), RunConfig(np=2)) for i in (0, 1)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "0,1"]
    assert [e[contract.DEVICE_INDEX_ENV] for e in envs] == ["0", "1"]


def test_shared_ids_are_per_host() -> None:
    assert not shared_gpu_ids(_infos(("a", ("0",), ()), ("a", ("1",), ())))
    assert shared_gpu_ids(_infos(("a", ("0", "1"), ()), ("a", ("1",), ())))


@pytest.mark.parametrize(
    "tasks, booked",
    [
        # The same id, different physical GPUs: containers, each with a GPU of its own.
        ((("a", ("0",), ("GPU-1",)), ("a", ("0",), ("GPU-2",))), None),
        # Identity unknown: taken as separate GPUs.
        ((("a", ("0",), ()), ("a", ("0",), ())), None),
        # The same physical GPU on two hosts cannot be: hosts differ, so no conflict.
        ((("a", ("0",), ("GPU-1",)), ("b", ("0",), ("GPU-1",))), None),
        # One physical GPU, two tasks: refused, whatever ids they call it by.
        ((("a", ("0",), ("GPU-1",)), ("a", ("3",), ("GPU-1",))), "tasks 0 and 1 on a"),
    ],
)
def test_double_booking_is_found_by_physical_identity(tasks: Any, booked: str | None) -> None:
    found = gpu_double_booking(_infos(*tasks))
    if booked is None:
        assert found is None
    else:
        assert found is not None and booked in found and "GPU-1" in found
        assert "spark.executor.resource.gpu.amount" in found


def test_uuids_come_from_nvidia_smi_in_the_tasks_order() -> None:
    assert uuids_for(["1", "0"], SMI) == ("GPU-bbbb", "GPU-aaaa")
    assert uuids_for(["2"], SMI) == ()  # not listed: unknown, not guessed
    assert uuids_for(["gpu-x"], SMI) == ()


def test_task_info_carries_uuids_through_json() -> None:
    info = TaskInfo(index=0, host="h", port=1, gpus=("0",), gpu_uuids=("GPU-1",))
    assert TaskInfo.from_json(info.to_json()) == info
    assert TaskInfo.from_json({"index": 0, "host": "h", "port": 1}).gpu_uuids == ()


def test_the_driver_refuses_a_double_booked_gpu_before_any_rank_starts(server) -> None:  # noqa: F811
    went: list[bool] = []

    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            info = TaskInfo(
                index=task.index, host="h", port=0, gpus=(str(task.index),), gpu_uuids=("GPU-1",)
            )
            task.client.send(protocol.HELLO(index=task.index, info=json.loads(info.to_json())))
            threading.Thread(target=task._listen, daemon=True).start()
        for task in tasks:
            task.aborted.wait(10)
        went.append(any(task.go.is_set() for task in tasks))
        done(None, None)

    mon = RunMonitor(RunConfig(np=2, grace_period=1), server)
    launch = FakeLaunch(server, 2, body)
    with pytest.raises(ConfigurationError, match="tasks 0 and 1 on h were both given the GPU"):
        mon.watch(launch)
    assert went == [False]


def test_a_double_booked_gpu_names_the_tasks_by_index_whatever_their_arrival(
    server,  # noqa: F811
) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in reversed(tasks):  # task 1 says hello first
            info = TaskInfo(
                index=task.index, host="h", port=0, gpus=(str(task.index),), gpu_uuids=("GPU-1",)
            )
            task.client.send(protocol.HELLO(index=task.index, info=json.loads(info.to_json())))
            threading.Thread(target=task._listen, daemon=True).start()
        for task in tasks:
            task.aborted.wait(10)
        done(None, None)

    mon = RunMonitor(RunConfig(np=2, grace_period=1), server)
    with pytest.raises(ConfigurationError, match="tasks 0 and 1 on h were both given the GPU"):
        mon.watch(FakeLaunch(server, 2, body))
