"""One rule for what a node is: what LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_*, the
devices and Horovod's local and cross ranks say on fake layouts, for node="auto", "host" and
"task"; and the torchrun variables that make frameworks take the ranks for torchrun's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from sparktrain import contract
from sparktrain.backends import get_backend
from sparktrain.backends.base import rank_env
from sparktrain.backends.horovod import horovod_slot, horovod_slots
from sparktrain.config import RunConfig
from sparktrain.driver.layout import layout_problem
from sparktrain.errors import ConfigurationError
from sparktrain.layout.cluster import ClusterSpec, TaskInfo, build_cluster_spec, node_rule
from sparktrain.layout.rendezvous import FRAME_BUDGET, GoAssembler, go_messages, plan, view_of
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.rank_launchers import worker_env

SHIM = {contract.HOROVOD_SHIM_ENV: "builtin"}


def tasks(*layout: tuple[str, tuple[str, ...]], per_task: int = 1) -> list[TaskInfo]:
    """Spark task ``i`` on host ``layout[i][0]`` holding GPUs ``layout[i][1]``, running
    ``per_task`` ranks (one slot each, the GPUs dealt in order)."""
    infos = []
    for partition, (host, gpus) in enumerate(layout):
        each = len(gpus) // per_task
        for slot in range(per_task):
            infos.append(
                TaskInfo(
                    index=partition * per_task + slot,
                    host=host,
                    port=7000 + partition if slot == 0 else 0,
                    gpus=tuple(gpus[slot * each : (slot + 1) * each]),
                    cpus=1,
                    slot=slot,
                )
            )
    return infos


def envs(infos: list[TaskInfo], **settings: object) -> list[dict[str, str]]:
    """Every rank's variables (in rank order) under the built-in horovod.torch backend, which
    gives both torchrun's and Horovod's."""
    config = RunConfig(np=len(infos), backend="horovod", **settings)  # type: ignore[arg-type]
    spec = build_cluster_spec(infos, config.node, config.use_gpu)
    backend = get_backend("horovod")
    return [{**rank_env(spec, r, config), **backend.env(spec, r, SHIM, config)} for r in spec.ranks]


def column(rows: list[dict[str, str]], name: str) -> list[str | None]:
    return [row.get(name) for row in rows]


ONE_HOST_DISTINCT = tasks(("h", ("0",)), ("h", ("1",)))
ONE_HOST_ALIKE = tasks(("h", ("0",)), ("h", ("0",)))  # containers, each numbering from 0


@pytest.mark.parametrize("node", ["auto", "host"])
def test_one_host_with_distinct_gpu_ids_is_one_node(node: str) -> None:
    rows = envs(ONE_HOST_DISTINCT, node=node)
    assert column(rows, "LOCAL_RANK") == ["0", "1"]
    assert column(rows, "LOCAL_WORLD_SIZE") == ["2", "2"]
    assert column(rows, "NODE_RANK") == column(rows, "GROUP_RANK") == ["0", "0"]
    assert column(rows, "GROUP_WORLD_SIZE") == ["1", "1"]
    assert column(rows, "CUDA_VISIBLE_DEVICES") == ["0,1", "0,1"]
    assert column(rows, contract.DEVICE_INDEX_ENV) == ["0", "1"]
    assert column(rows, "HOROVOD_LOCAL_RANK") == ["0", "1"]
    assert column(rows, "HOROVOD_LOCAL_SIZE") == ["2", "2"]
    assert column(rows, "HOROVOD_CROSS_RANK") == ["0", "0"]
    assert column(rows, "HOROVOD_CROSS_SIZE") == ["1", "1"]
    assert column(rows, "HOROVOD_HOSTNAME") == ["h", "h"]


@pytest.mark.parametrize("infos", [ONE_HOST_DISTINCT, ONE_HOST_ALIKE], ids=["distinct", "alike"])
def test_node_task_makes_every_task_a_node_as_torchdistributor_does(
    infos: list[TaskInfo],
) -> None:
    rows = envs(infos, node="task")
    assert column(rows, "RANK") == ["0", "1"]
    assert column(rows, "LOCAL_RANK") == ["0", "0"]
    assert column(rows, "LOCAL_WORLD_SIZE") == ["1", "1"]
    assert column(rows, "NODE_RANK") == column(rows, "GROUP_RANK") == ["0", "1"]
    assert column(rows, "GROUP_WORLD_SIZE") == ["2", "2"]
    # Each rank sees its own task's GPU alone, as device 0.
    assert column(rows, "CUDA_VISIBLE_DEVICES") == [info.gpus[0] for info in infos]
    assert column(rows, contract.DEVICE_INDEX_ENV) == ["0", "0"]
    assert column(rows, "HOROVOD_LOCAL_RANK") == ["0", "0"]
    assert column(rows, "HOROVOD_LOCAL_SIZE") == ["1", "1"]
    assert column(rows, "HOROVOD_CROSS_RANK") == ["0", "1"]
    assert column(rows, "HOROVOD_CROSS_SIZE") == ["2", "2"]
    assert column(rows, "HOROVOD_HOSTNAME") == ["h-0", "h-1"]
    # The same host: files on it are shared (see sparktrain.worker.shared_paths).
    assert column(rows, contract.NUM_HOSTS_ENV) == ["1", "1"]


def test_auto_makes_tasks_nodes_where_they_number_their_gpus_each_from_0() -> None:
    assert envs(ONE_HOST_ALIKE) == envs(ONE_HOST_ALIKE, node="task")
    assert node_rule(ONE_HOST_ALIKE) == "task"
    assert node_rule(ONE_HOST_DISTINCT) == "host"
    # GPUs hidden: nothing is numbered, so the host stays the node.
    assert node_rule(ONE_HOST_ALIKE, "auto", use_gpu=False) == "host"
    rows = envs(ONE_HOST_ALIKE, use_gpu=False)
    assert column(rows, "LOCAL_RANK") == ["0", "1"]
    assert column(rows, "CUDA_VISIBLE_DEVICES") == ["", ""]


def test_one_host_alike_ids_is_task_nodes_even_where_another_host_is_fine() -> None:
    # One rule for the whole job: num_nodes is one number a framework can be told.
    infos = tasks(("a", ("0",)), ("b", ("0",)), ("a", ("0",)), ("b", ("1",)))
    rows = envs(infos)
    assert column(rows, "LOCAL_RANK") == ["0"] * 4
    assert column(rows, "GROUP_WORLD_SIZE") == ["4"] * 4
    assert column(rows, "HOROVOD_HOSTNAME") == ["a-0", "a-1", "b-0", "b-1"]


@pytest.mark.parametrize("node", ["auto", "host", "task"])
def test_one_task_per_host_is_the_same_whatever_the_rule(node: str) -> None:
    rows = envs(tasks(("a", ("0",)), ("b", ("0",))), node=node)
    assert column(rows, "LOCAL_RANK") == ["0", "0"]
    assert column(rows, "NODE_RANK") == ["0", "1"]
    assert column(rows, "GROUP_WORLD_SIZE") == ["2", "2"]
    assert column(rows, "CUDA_VISIBLE_DEVICES") == ["0", "0"]
    assert column(rows, contract.NUM_HOSTS_ENV) == ["2", "2"]


@pytest.mark.parametrize(
    "node, local_rank, local_size, node_rank, visible, cross_rank, cross_size",
    [
        ("host", "0123", "4444", "0000", ["0,1,2,3"] * 4, "0000", "1111"),
        ("task", "0101", "2222", "0011", ["0,1", "0,1", "2,3", "2,3"], "0011", "2222"),
    ],
)
def test_two_ranks_per_task_two_tasks_on_one_host(
    node: str,
    local_rank: str,
    local_size: str,
    node_rank: str,
    visible: list[str],
    cross_rank: str,
    cross_size: str,
) -> None:
    rows = envs(tasks(("h", ("0", "1")), ("h", ("2", "3")), per_task=2), node=node)
    assert "".join(column(rows, "LOCAL_RANK")) == local_rank  # type: ignore[arg-type]
    assert "".join(column(rows, "LOCAL_WORLD_SIZE")) == local_size  # type: ignore[arg-type]
    assert "".join(column(rows, "NODE_RANK")) == node_rank  # type: ignore[arg-type]
    assert column(rows, "CUDA_VISIBLE_DEVICES") == visible
    assert "".join(column(rows, "HOROVOD_CROSS_RANK")) == cross_rank  # type: ignore[arg-type]
    assert "".join(column(rows, "HOROVOD_CROSS_SIZE")) == cross_size  # type: ignore[arg-type]
    # cuda:{LOCAL_RANK} is GPU 0, 1, 2, 3 in rank order: each rank's own.
    own = [r["CUDA_VISIBLE_DEVICES"].split(",")[int(r["LOCAL_RANK"])] for r in rows]
    assert own == ["0", "1", "2", "3"]


def test_two_ranks_per_task_in_containers_numbering_from_0() -> None:
    rows = envs(tasks(("h", ("0", "1")), ("h", ("0", "1")), per_task=2))  # auto
    assert column(rows, "LOCAL_RANK") == ["0", "1", "0", "1"]
    assert column(rows, "NODE_RANK") == ["0", "0", "1", "1"]
    assert column(rows, "CUDA_VISIBLE_DEVICES") == ["0,1"] * 4
    assert column(rows, contract.DEVICE_INDEX_ENV) == ["0", "1", "0", "1"]


def test_cpu_only_task_nodes() -> None:
    infos = tasks(("h", ()), ("h", ()), ("g", ()))
    assert node_rule(infos) == "host"
    rows = envs(infos, node="task")
    assert column(rows, "LOCAL_RANK") == ["0", "0", "0"]
    assert column(rows, "NODE_RANK") == ["0", "1", "2"]
    assert column(rows, "CUDA_VISIBLE_DEVICES") == ["", "", ""]
    assert contract.DEVICE_INDEX_ENV not in rows[0]


LAYOUTS: dict[str, list[TaskInfo]] = {
    "one host distinct": ONE_HOST_DISTINCT,
    "one host alike": ONE_HOST_ALIKE,
    "interleaved hosts": tasks(("a", ("0",)), ("b", ("0",)), ("a", ("1",)), ("b", ("1",))),
    "interleaved alike": tasks(("a", ("0",)), ("b", ("0",)), ("a", ("0",)), ("c", ("0",))),
    "two per task": tasks(("a", ("0", "1")), ("b", ("0", "1")), ("a", ("2", "3")), per_task=2),
    "uneven cpu": tasks(("a", ()), ("a", ()), ("b", ()), ("a", ())),
}


# Every layout under every rule the driver lets run (node="host" on tasks that number their
# GPUs alike is refused: see test_node_host_is_refused_...).
RUNNABLE = [
    (name, node)
    for name, infos in LAYOUTS.items()
    for node in ("auto", "host", "task")
    if layout_problem(infos, RunConfig(np=len(infos), node=node)) is None
]


@pytest.mark.parametrize("name, node", RUNNABLE)
def test_torchruns_invariants_hold_on_every_layout(name: str, node: str) -> None:
    infos = LAYOUTS[name]
    rows = envs(infos, node=node)
    world = len(infos)
    sizes: dict[int, int] = {}
    for row in rows:
        sizes[int(row["NODE_RANK"])] = int(row["LOCAL_WORLD_SIZE"])
    assert sorted(sizes) == list(range(len(sizes)))
    for row in rows:
        node_rank, local_rank = int(row["NODE_RANK"]), int(row["LOCAL_RANK"])
        # torchrun's numbering: a node's ranks are contiguous, nodes in order.
        assert int(row["RANK"]) == sum(sizes[n] for n in range(node_rank)) + local_rank
        assert row["GROUP_RANK"] == row["NODE_RANK"]
        assert int(row["GROUP_WORLD_SIZE"]) == len(sizes)
        assert row["ROLE_RANK"] == row["RANK"] and row["ROLE_WORLD_SIZE"] == str(world)
        assert row["HOROVOD_LOCAL_RANK"] == row["LOCAL_RANK"]
        assert row["HOROVOD_LOCAL_SIZE"] == row["LOCAL_WORLD_SIZE"]
    # Device cuda:{LOCAL_RANK} is the rank's own GPU, and the worker pins the same one.
    spec = build_cluster_spec(infos, node)
    for rank, row in zip(spec.ranks, rows, strict=True):
        if rank.task.gpus:
            picked = row["CUDA_VISIBLE_DEVICES"].split(",")[int(row["LOCAL_RANK"])]
            assert picked == rank.task.gpus[0]
            assert row[contract.DEVICE_INDEX_ENV] == row["LOCAL_RANK"]


@pytest.mark.parametrize("node", ["auto", "host", "task"])
@pytest.mark.parametrize("name", LAYOUTS)
def test_each_task_computes_what_the_whole_layout_gives(name: str, node: str) -> None:
    infos = LAYOUTS[name]
    config = RunConfig(np=len(infos), backend="horovod", node=node, horovod_impl="builtin")
    layout = plan(infos, node=node)
    whole = layout.spec
    backend = get_backend("horovod")
    slots_of: dict[int, list[int]] = {}
    for info in infos:
        slots_of.setdefault(info.first_index, []).append(info.index)
    for slots in slots_of.values():
        assembler = GoAssembler()
        for message in go_messages(layout, slots):
            assembler.add(message)
        assert assembler.go is not None
        view = view_of(assembler.go).spec
        assert (view.num_nodes, view.num_hosts, view.nodes) == (
            whole.num_nodes,
            whole.num_hosts,
            whole.nodes,
        )
        for index in slots:
            rank = view.for_task(index)
            assert rank_env(view, rank, config) == rank_env(whole, whole.for_task(index), config)
            assert backend.env(view, rank, SHIM, config) == backend.env(
                whole, whole.for_task(index), SHIM, config
            )
            assert horovod_slot(view, rank) == horovod_slots(whole)[rank.rank]
        if 0 in slots:
            # Rank 0's task sizes Horovod's rendezvous server: it has every node.
            assert horovod_slots(view) == horovod_slots(whole)


def test_node_host_is_refused_where_tasks_number_their_gpus_each_from_0() -> None:
    problem = layout_problem(ONE_HOST_ALIKE, RunConfig(np=2, node="host"))
    assert problem is not None
    assert "tasks 0 and 1 on h both call their GPU '0'" in problem
    assert "node='task'" in problem and "spark.sparktrain.node" in problem
    assert layout_problem(ONE_HOST_ALIKE, RunConfig(np=2, node="host", use_gpu=False)) is None
    assert layout_problem(ONE_HOST_DISTINCT, RunConfig(np=2, node="host")) is None
    assert layout_problem(ONE_HOST_ALIKE, RunConfig(np=2)) is None  # auto: task nodes


def test_mpirun_cannot_make_tasks_nodes() -> None:
    # Refused as the settings are made, before anything starts.
    with pytest.raises(ConfigurationError, match="launcher='mpi' cannot make every Spark task"):
        RunConfig(np=2, backend="horovod", launcher="mpi", node="task")
    # node="auto" makes tasks nodes only once the layout is known: refused then.
    config = RunConfig(np=2, backend="horovod", launcher="mpi")
    spec = build_cluster_spec(ONE_HOST_ALIKE)
    problem = get_backend("horovod").layout_problem(spec, config)
    assert problem is not None and "here by node='auto'" in problem
    assert (
        get_backend("horovod").layout_problem(build_cluster_spec(ONE_HOST_DISTINCT), config) is None
    )


@pytest.mark.parametrize("value", ["node", "hosts", "", "TASK"])
def test_node_setting_names_its_values(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=2, node=value)
    message = str(info.value)
    assert "node must be one of auto, host, task" in message
    assert "spark.sparktrain.node" in message


def test_node_setting_from_spark_conf_and_environment() -> None:
    assert RunConfig.resolve(2, environ={}).node == "auto"
    conf = {"spark.sparktrain.node": "task"}
    assert RunConfig.resolve(2, spark_conf=conf, environ={}).node == "task"
    assert RunConfig.resolve(2, spark_conf=conf, environ={"SPARKTRAIN_NODE": "host"}).node == "host"
    assert RunConfig.resolve(2, {"node": "auto"}, conf, {}).node == "auto"


def _rank_process_env(
    tmp_path: Path, spec: ClusterSpec, index: int, shared: dict[str, str], **settings: object
) -> dict:
    config = RunConfig(np=spec.world_size, max_restarts=3, **settings)  # type: ignore[arg-type]
    job = TaskJob(
        run_id="run-7", attempt=2, config=config.to_json(), channel="", key=b"", payload=b""
    )
    backend = get_backend(config.backend)
    return worker_env(TaskSession(job, None), spec, spec.for_task(index), backend, shared, tmp_path)


@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_every_rank_gets_torchruns_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str
) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    spec = build_cluster_spec(ONE_HOST_DISTINCT, "task")
    shared = {} if backend == "torch" else SHIM
    env = _rank_process_env(tmp_path, spec, 1, shared, backend=backend, horovod_impl="builtin")
    expected = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "7000",
        "TORCHELASTIC_RUN_ID": "run-7",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    assert {name: env.get(name) for name in expected} == expected
    # Not set: the worker records every rank's exception itself (see the README).
    assert "TORCHELASTIC_ERROR_FILE" not in env


@pytest.mark.parametrize("name", ["TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE", "ROLE_NAME"])
def test_torchrun_variables_are_reserved(name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"env may not set {name}"):
        RunConfig(np=1, env={name: "x"})


def _lightning_view(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple:
    environments = pytest.importorskip("lightning.fabric.plugins.environments")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = environments.TorchElasticEnvironment
    assert found.detect(), "Lightning does not take the ranks for torchrun's"
    cluster = found()
    return cluster.world_size(), cluster.global_rank(), cluster.local_rank(), cluster.node_rank()


@pytest.mark.parametrize("node, expected", [("task", (2, 1, 0, 1)), ("host", (2, 1, 1, 0))])
def test_lightning_reads_the_ranks_as_torchruns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, node: str, expected: tuple
) -> None:
    spec = build_cluster_spec(ONE_HOST_DISTINCT, node)
    env = _rank_process_env(tmp_path, spec, 1, {}, node=node)
    place = {k: v for k, v in env.items() if k in contract.PLACE_VARIABLES}
    assert _lightning_view(monkeypatch, place) == expected


def test_the_shared_directory_check_counts_hosts_not_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparktrain.worker import shared_paths

    spec = build_cluster_spec(ONE_HOST_ALIKE)  # two task nodes on one host
    rows = [rank_env(spec, r, RunConfig(np=2)) for r in spec.ranks]
    for row in rows:
        for name, value in row.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert not shared_paths.spans_hosts()
        assert shared_paths._on_rank0_host()
    spec = build_cluster_spec(tasks(("a", ()), ("b", ())))
    for name, value in rank_env(spec, spec.ranks[1], RunConfig(np=2)).items():
        monkeypatch.setenv(name, value)
    assert shared_paths.spans_hosts() and not shared_paths._on_rank0_host()


def _names(infos: Sequence[TaskInfo]) -> list[str]:
    spec = build_cluster_spec(infos, "task")
    return [name for name, _ in spec.node_sizes]


def test_task_node_names_are_unique_and_url_safe() -> None:
    names = _names(LAYOUTS["two per task"])
    assert names == ["a-0", "a-1", "b-0"]
    assert all("/" not in name for name in names)


def test_rank0s_go_stays_small_with_thousands_of_task_nodes() -> None:
    # 16384 tasks, 8 per host, each numbering its GPU "0": every task is a node. Rank 0's
    # task is told each host's node sizes (to size Horovod's rendezvous), not their names.
    hosts = [f"198.18.{h // 250}.{h % 250}" for h in range(2048)]
    infos = tasks(*[(hosts[i % len(hosts)], ("0",)) for i in range(16384)])
    layout = plan(infos)
    assert layout.spec.nodes == "task" and layout.spec.num_nodes == 16384
    messages = go_messages(layout, [0])
    assert len(messages) == 1 and len(json.dumps(messages[0])) < FRAME_BUDGET
    view = view_of(messages[0]).spec
    slots = horovod_slots(view)
    assert slots == horovod_slots(layout.spec) and len(slots) == 16384
    assert {slot.local_size for slot in slots} == {1}
