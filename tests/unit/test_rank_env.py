"""rank_env + TorchBackend.env: the variables each rank gets, for fake multi-host layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparktrain import contract
from sparktrain.backends import get_backend
from sparktrain.backends.base import interface_env, rank_env, visible_devices
from sparktrain.backends.torch import TorchBackend
from sparktrain.config import PRIVATE_ENV_PREFIX, RESERVED_ENV, RunConfig
from sparktrain.errors import ConfigurationError
from sparktrain.layout.cluster import ClusterSpec, TaskInfo, build_cluster_spec
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.rank_launchers import worker_env

DEVICE_INDEX = "_SPARKTRAIN_DEVICE_INDEX"


def full_env(spec: ClusterSpec, index: int, config: RunConfig) -> dict[str, str]:
    """What the task with ``index`` gives its rank from sparktrain (not the inherited env)."""
    rank = spec.for_task(index)
    backend = get_backend("torch")
    return {**rank_env(spec, rank, config), **backend.env(spec, rank, {}, config)}


def gpu_spec(tasks: list[tuple[str, tuple[str, ...]]], ifname: str | None = None) -> ClusterSpec:
    """Task ``i`` on ``tasks[i][0]`` holding GPUs ``tasks[i][1]``."""
    return build_cluster_spec(
        [
            TaskInfo(index=i, host=h, port=7000 + i, gpus=g, cpus=2, ifname=ifname)
            for i, (h, g) in enumerate(tasks)
        ]
    )


def test_every_env_variable_on_a_two_host_layout() -> None:
    spec = gpu_spec([("10.0.0.1", ()), ("10.0.0.2", ()), ("10.0.0.1", ())])
    config = RunConfig(np=3)
    # task -> (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK)
    expected = {0: ("0", "0", "2", "0"), 1: ("2", "0", "1", "1"), 2: ("1", "1", "2", "0")}
    for index, (rank, local_rank, local_size, node_rank) in expected.items():
        assert full_env(spec, index, config) == {
            "RANK": rank,
            "WORLD_SIZE": "3",
            "LOCAL_RANK": local_rank,
            "LOCAL_WORLD_SIZE": local_size,
            "NODE_RANK": node_rank,
            "GROUP_RANK": node_rank,
            "GROUP_WORLD_SIZE": "2",
            "ROLE_NAME": "default",
            "ROLE_RANK": rank,
            "ROLE_WORLD_SIZE": "3",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "7000",
            "OMP_NUM_THREADS": "2",
            "CUDA_VISIBLE_DEVICES": "",
            contract.HOST_ENV: "10.0.0.2" if node_rank == "1" else "10.0.0.1",
            contract.RANK0_HOST_ENV: "10.0.0.1",
            contract.NUM_HOSTS_ENV: "2",
        }


def test_env_values_are_all_strings() -> None:
    spec = gpu_spec([("a", ("0",)), ("a", ("1",))], ifname="eth0")
    for index in (0, 1):
        env = full_env(spec, index, RunConfig(np=2))
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


@pytest.mark.parametrize("cpus, threads", [(1, "1"), (4, "4"), (0, "1"), (-2, "1")])
def test_omp_num_threads_follows_the_task_cpus(cpus: int, threads: str) -> None:
    spec = build_cluster_spec([TaskInfo(index=0, host="a", port=1, cpus=cpus)])
    assert rank_env(spec, spec.ranks[0], RunConfig(np=1))["OMP_NUM_THREADS"] == threads


# task hosts and GPUs -> per task index: (CUDA_VISIBLE_DEVICES, device index)
GPU_LAYOUTS: dict[str, tuple[list[tuple[str, tuple[str, ...]]], dict[int, tuple[str, str]]]] = {
    "one task, one gpu": ([("a", ("0",))], {0: ("0", "0")}),
    "one task, a non-zero gpu": ([("a", ("3",))], {0: ("3", "0")}),
    "one host, gpus in task order": (
        [("a", ("0",)), ("a", ("1",))],
        {0: ("0,1", "0"), 1: ("0,1", "1")},
    ),
    # Spark handed out GPUs in the opposite order to task indices on host a.
    "one host, gpus out of task order": (
        [("a", ("1",)), ("a", ("0",))],
        {0: ("1,0", "0"), 1: ("1,0", "1")},
    ),
    "two hosts interleaved, host b out of order": (
        [("a", ("0",)), ("b", ("1",)), ("a", ("1",)), ("b", ("0",)), ("b", ("2",))],
        {
            0: ("0,1", "0"),
            2: ("0,1", "1"),
            1: ("1,0,2", "0"),
            3: ("1,0,2", "1"),
            4: ("1,0,2", "2"),
        },
    ),
    "gpu uuids": (
        [("a", ("GPU-b",)), ("a", ("GPU-a",))],
        {0: ("GPU-b,GPU-a", "0"), 1: ("GPU-b,GPU-a", "1")},
    ),
    # A task with two GPUs: its own first GPU is not at LOCAL_RANK; the worker pins by index.
    "several gpus per task": (
        [("a", ("2", "3")), ("a", ("0", "1"))],
        {0: ("2,3,0,1", "0"), 1: ("2,3,0,1", "2")},
    ),
}


@pytest.mark.parametrize("name", list(GPU_LAYOUTS))
def test_cuda_visible_devices(name: str) -> None:
    tasks, expected = GPU_LAYOUTS[name]
    spec = gpu_spec(tasks)
    config = RunConfig(np=len(tasks))
    for index, (visible, device_index) in expected.items():
        rank = spec.for_task(index)
        env = rank_env(spec, rank, config)
        assert env["CUDA_VISIBLE_DEVICES"] == visible
        assert env[DEVICE_INDEX] == device_index
        devices = visible.split(",")
        # The device the worker pins is the GPU Spark gave this task.
        assert devices[int(device_index)] == rank.task.gpus[0]
        # Only GPUs of this host are visible.
        host_gpus = {g for t in spec.on_host(rank.task.host) for g in t.task.gpus}
        assert set(devices) == host_gpus
        if len(rank.task.gpus) == 1:
            # One GPU per task: cuda:{LOCAL_RANK} (DDP tutorials) is the task's own GPU.
            assert devices[int(env["LOCAL_RANK"])] == rank.task.gpus[0]
            assert device_index == env["LOCAL_RANK"]


def test_visible_devices_is_per_host() -> None:
    spec = gpu_spec([("a", ("0",)), ("b", ("0",)), ("a", ("1",))])
    assert visible_devices(spec, spec.for_task(0)) == ["0", "1"]
    assert visible_devices(spec, spec.for_task(1)) == ["0"]


def test_use_gpu_false_hides_gpus() -> None:
    spec = gpu_spec([("a", ("0",)), ("a", ("1",))])
    config = RunConfig(np=2, use_gpu=False)
    for index in (0, 1):
        env = rank_env(spec, spec.for_task(index), config)
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert DEVICE_INDEX not in env


@pytest.mark.parametrize("use_gpu", [None, True])
def test_no_gpus_means_empty_cuda_visible_devices(use_gpu: bool | None) -> None:
    spec = gpu_spec([("a", ()), ("b", ())])
    config = RunConfig(np=2, use_gpu=use_gpu)
    for index in (0, 1):
        env = rank_env(spec, spec.for_task(index), config)
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert DEVICE_INDEX not in env


def test_use_gpu_true_and_none_expose_assigned_gpus() -> None:
    spec = gpu_spec([("a", ("5",))])
    for use_gpu in (None, True):
        env = rank_env(spec, spec.ranks[0], RunConfig(np=1, use_gpu=use_gpu))
        assert env["CUDA_VISIBLE_DEVICES"] == "5"


def test_socket_ifname_when_known() -> None:
    spec = gpu_spec([("10.0.0.1", ()), ("10.0.0.2", ())], ifname="ens5")
    env = full_env(spec, 1, RunConfig(np=2))
    assert env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert env["NCCL_SOCKET_IFNAME"] == "ens5"


@pytest.mark.parametrize("ifname", [None, ""])
def test_no_socket_ifname_when_unknown(ifname: str | None) -> None:
    spec = gpu_spec([("a", ())], ifname=ifname)
    env = full_env(spec, 0, RunConfig(np=1))
    assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" not in env
    assert interface_env(spec.ranks[0]) == {}


def test_ifname_is_the_ranks_own_interface() -> None:
    spec = build_cluster_spec(
        [
            TaskInfo(index=0, host="a", port=1, ifname="eth0"),
            TaskInfo(index=1, host="b", port=1, ifname="ib0"),
        ]
    )
    assert full_env(spec, 0, RunConfig(np=2))["GLOO_SOCKET_IFNAME"] == "eth0"
    assert full_env(spec, 1, RunConfig(np=2))["NCCL_SOCKET_IFNAME"] == "ib0"


def test_torch_backend_is_registered_and_needs_no_prepare() -> None:
    backend = get_backend("torch")
    assert isinstance(backend, TorchBackend)
    assert backend.name == "torch"
    assert backend.needs_prepare is False
    spec = gpu_spec([("a", ())])
    assert backend.prepare(spec, RunConfig(np=1)) == {}


@pytest.mark.parametrize("launcher", ["mpi", "gloo", "horovodrun"])
def test_torch_backend_rejects_horovod_launchers(launcher: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        TorchBackend().check(RunConfig(np=2, launcher=launcher))
    message = str(info.value)
    assert f"launcher={launcher!r}" in message
    assert "backend='horovod'" in message and "leave launcher unset" in message


@pytest.mark.parametrize("launcher", [None, "torch"])
def test_torch_backend_accepts_its_launchers(launcher: str | None) -> None:
    config = RunConfig(np=2, launcher=launcher)
    TorchBackend().check(config)
    # Accepted means torch's own wiring: env:// from MASTER_ADDR/PORT, no Horovod rendezvous.
    spec = gpu_spec([("10.0.0.1", ()), ("10.0.0.2", ())])
    env = full_env(spec, 1, config)
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == str(spec.master_port)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert not [name for name in env if name.startswith("HOROVOD_")]


def test_every_per_rank_variable_is_reserved() -> None:
    spec = gpu_spec([("a", ())])
    per_rank = set(full_env(spec, 0, RunConfig(np=1)))
    # Values the user may legitimately tune are not rank-specific.
    tunable = {"OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"}
    public = {k for k in per_rank - tunable if not k.startswith(PRIVATE_ENV_PREFIX)}
    assert public <= RESERVED_ENV
    with pytest.raises(ConfigurationError, match="env may not set _SPARKTRAIN_HOST"):
        RunConfig(np=1, env={contract.HOST_ENV: "elsewhere"})


@pytest.mark.parametrize(
    "inherited, given, expected",
    [
        ({}, {}, "1"),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, {}, "3"),  # the executor's own setting
        ({}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "0"),  # the run's env=
        ({"NCCL_ASYNC_ERROR_HANDLING": "0"}, {}, None),  # set under the older name: left be
    ],
)
def test_collectives_end_the_rank_on_error_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    inherited: dict[str, str],
    given: dict[str, str],
    expected: str | None,
) -> None:
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(name, raising=False)
    for name, value in inherited.items():
        monkeypatch.setenv(name, value)
    config = RunConfig(np=-1, env=given)
    job = TaskJob(run_id="r", attempt=0, config=config.to_json(), channel="", key=b"", payload=b"")
    spec = gpu_spec([("h", ())])
    env = worker_env(TaskSession(job, None), spec, spec.ranks[0], TorchBackend(), {}, tmp_path)
    assert env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == expected
