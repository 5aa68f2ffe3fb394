"""The Horovod backend's rank mapping and checks; no Horovod build needed (one test compares
with Horovod's own host assignment when it is installed)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from sparktrain import contract
from sparktrain.backends import get_backend
from sparktrain.backends import horovod as hb
from sparktrain.backends import horovod_install as hi
from sparktrain.backends.base import rank_env
from sparktrain.config import RunConfig
from sparktrain.errors import ConfigurationError, SparkTrainError
from sparktrain.layout.cluster import ClusterSpec, TaskInfo, build_cluster_spec

SHARED = {hb.ADDR_KEY: "10.0.0.1", hb.PORT_KEY: "4242"}


def spec_of(hosts: list[str], ifname: str | None = None) -> ClusterSpec:
    """A ClusterSpec whose task ``i`` runs on ``hosts[i]``."""
    infos = [TaskInfo(index=i, host=h, port=5000 + i, ifname=ifname) for i, h in enumerate(hosts)]
    return build_cluster_spec(infos)


# hosts of tasks 0..n-1 -> per global rank: (host, local_rank, local_size, cross_rank,
# cross_size, task index)
LAYOUTS = {
    "one rank": (["a"], [("a", 0, 1, 0, 1, 0)]),
    "one host, two ranks": (["a", "a"], [("a", 0, 2, 0, 1, 0), ("a", 1, 2, 0, 1, 1)]),
    "two hosts, one rank each": (["a", "b"], [("a", 0, 1, 0, 2, 0), ("b", 0, 1, 1, 2, 1)]),
    "two hosts, two ranks each, interleaved": (
        ["a", "b", "a", "b"],
        [("a", 0, 2, 0, 2, 0), ("a", 1, 2, 0, 2, 2), ("b", 0, 2, 1, 2, 1), ("b", 1, 2, 1, 2, 3)],
    ),
    # Hosts with 2, 1 and 3 tasks, interleaved by task index: a=0,3 b=1 c=2,4,5.
    "hosts with 2,1,3 tasks, interleaved": (
        ["a", "b", "c", "a", "c", "c"],
        [
            ("a", 0, 2, 0, 3, 0),
            ("a", 1, 2, 0, 2, 3),
            ("b", 0, 1, 1, 3, 1),
            ("c", 0, 3, 2, 3, 2),
            ("c", 1, 3, 1, 2, 4),
            ("c", 2, 3, 0, 1, 5),
        ],
    ),
    # The first host is the smallest: the bigger host's higher local ranks are alone.
    "hosts with 1,3 tasks": (
        ["a", "b", "b", "b"],
        [("a", 0, 1, 0, 2, 0), ("b", 0, 3, 1, 2, 1), ("b", 1, 3, 0, 1, 2), ("b", 2, 3, 0, 1, 3)],
    ),
    "three hosts, 1,2,1 tasks, last host first seen last": (
        ["a", "b", "b", "c"],
        [("a", 0, 1, 0, 3, 0), ("b", 0, 2, 1, 3, 1), ("b", 1, 2, 0, 1, 2), ("c", 0, 1, 2, 3, 3)],
    ),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_horovod_slots_table(name: str) -> None:
    hosts, expected = LAYOUTS[name]
    spec = spec_of(hosts)
    slots = hb.horovod_slots(spec)
    got = [
        (s.hostname, s.local_rank, s.local_size, s.cross_rank, s.cross_size, r.task.index)
        for s, r in zip(slots, spec.ranks, strict=True)
    ]
    assert got == expected
    assert [s.rank for s in slots] == list(range(len(hosts)))
    assert all(s.size == len(hosts) for s in slots)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_horovod_env_agrees_with_rank_env(name: str) -> None:
    hosts, _ = LAYOUTS[name]
    spec = spec_of(hosts)
    config = RunConfig(np=len(hosts), backend="horovod")
    backend = get_backend("horovod")
    for rank in spec.ranks:
        base = rank_env(spec, rank, config)
        env = backend.env(spec, rank, SHARED, config)
        assert env["HOROVOD_RANK"] == base["RANK"]
        assert env["HOROVOD_SIZE"] == base["WORLD_SIZE"]
        assert env["HOROVOD_LOCAL_RANK"] == base["LOCAL_RANK"]
        assert env["HOROVOD_LOCAL_SIZE"] == base["LOCAL_WORLD_SIZE"]
        assert env["HOROVOD_HOSTNAME"] == rank.task.host


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_horovod_slots_match_horovods_host_assignments(name: str) -> None:
    if hi.installed_horovod() is None:  # not sparktrain's driver stand-in either
        pytest.skip("Horovod is not installed (scripts/install-horovod.sh)")
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    hosts, _ = LAYOUTS[name]
    spec = spec_of(hosts)
    host_string = ",".join(f"{h}:{n}" for h, n in spec.hosts())
    theirs = get_host_assignments(parse_hosts(host_string), spec.world_size)
    ours = hb.horovod_slots(spec)
    assert [vars(s) for s in theirs] == [vars(s) for s in ours]


def test_env_has_everything_hvd_init_needs() -> None:
    spec = spec_of(["10.0.0.1", "10.0.0.2", "10.0.0.1"], ifname="eth0")
    config = RunConfig(np=3, backend="horovod", start_timeout=300)
    env = get_backend("horovod").env(spec, spec.for_task(1), SHARED, config)
    assert env == {
        "HOROVOD_HOSTNAME": "10.0.0.2",
        "HOROVOD_RANK": "2",
        "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "300",
        "HOROVOD_GLOO_IFACE": "eth0",
        # torch.distributed's env:// beside Horovod, as under torchrun.
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": str(spec.master_port),
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
    }


def test_env_without_interface_and_short_timeout() -> None:
    spec = spec_of(["a"])
    config = RunConfig(np=1, backend="horovod", start_timeout=5)
    env = get_backend("horovod").env(spec, spec.ranks[0], SHARED, config)
    assert "HOROVOD_GLOO_IFACE" not in env and "GLOO_SOCKET_IFNAME" not in env
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"  # never below Horovod's default


def test_env_without_rendezvous_is_a_bug() -> None:
    spec = spec_of(["a"])
    with pytest.raises(SparkTrainError, match="rendezvous address is missing"):
        get_backend("horovod").env(spec, spec.ranks[0], {}, RunConfig(np=1, backend="horovod"))


def test_needs_prepare_and_teardown_without_prepare() -> None:
    backend = get_backend("horovod")
    assert backend.needs_prepare
    backend.teardown()  # nothing started: a no-op


def _no_horovod(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name == "horovod" or name.startswith("horovod."):
            return None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    ("launcher", "impl"), [(None, "horovod"), ("gloo", "horovod"), ("mpi", None)]
)
def test_check_without_horovod_names_the_install_script(
    monkeypatch: pytest.MonkeyPatch, launcher: str | None, impl: str | None
) -> None:
    # Only where the installed Horovod is required: asked for, or needed by mpirun.
    _no_horovod(monkeypatch)
    config = RunConfig(np=2, backend="horovod", launcher=launcher, horovod_impl=impl)
    with pytest.raises(ConfigurationError) as err:
        get_backend("horovod").check(config)
    message = str(err.value)
    assert "Horovod is not installed" in message
    assert "sparktrain install-horovod" in message
    assert "pip install --no-build-isolation horovod" in message
    assert "backend='torch'" in message


def test_check_horovod_without_torch_extension(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "torch").mkdir()
    fake = importlib.machinery.ModuleSpec("horovod", None, is_package=True)
    fake.submodule_search_locations = [str(tmp_path)]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, package=None: fake if name == "horovod" else real(name, package),
    )
    with pytest.raises(ConfigurationError, match="without its PyTorch extension"):
        get_backend("horovod").check(RunConfig(np=2, backend="horovod", horovod_impl="horovod"))
    # auto: the ranks get the built-in horovod.torch instead.
    get_backend("horovod").check(RunConfig(np=2, backend="horovod"))
    assert hi.builtin_reason(RunConfig(np=2, backend="horovod")) == (
        "Horovod is installed without horovod.torch"
    )


def test_check_rejects_unknown_launcher() -> None:
    with pytest.raises(ConfigurationError, match="not a Horovod launcher"):
        get_backend("horovod").check(RunConfig(np=2, backend="horovod", launcher="ssh"))


# Real shared libraries to stand in for Horovod's torch extension: torch's own core library
# (linked without MPI, as a Gloo-only Horovod build is) and Open MPI's C++ bindings (linked
# against libmpi, as an MPI build is). Whether a build links MPI is read from the file itself.
OPEN_MPI_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libmpi_cxx.so.40")


def _torch_library() -> Path:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0], "lib", "libc10.so")


@pytest.fixture
def fake_horovod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An installed-looking horovod package (found by name only; every other module is found
    as usual) whose torch extension is a real library built without MPI."""
    package = tmp_path / "horovod"
    lib = package / "torch" / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"
    lib.parent.mkdir(parents=True)
    lib.symlink_to(_torch_library())
    fake = importlib.machinery.ModuleSpec("horovod", None, is_package=True)
    fake.submodule_search_locations = [str(package)]
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return fake if name == "horovod" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return lib


def test_check_gloo_with_horovod_passes(fake_horovod: Path) -> None:
    for config in (
        RunConfig(np=2, backend="horovod"),
        RunConfig(np=-2, backend="horovod", launcher="gloo"),
        RunConfig(np=2, backend="horovod", horovod_impl="horovod"),
    ):
        get_backend("horovod").check(config)
        assert hi.builtin_reason(config) is None  # the ranks use the installed Horovod
    assert hi.horovod_torch_library() == fake_horovod


def test_check_mpi_without_mpirun(monkeypatch: pytest.MonkeyPatch, fake_horovod: Path) -> None:
    monkeypatch.setattr(hb.shutil, "which", lambda name: None)
    with pytest.raises(ConfigurationError, match="apt-get install openmpi-bin libopenmpi-dev"):
        get_backend("horovod").check(RunConfig(np=2, backend="horovod", launcher="mpi"))


def test_check_mpi_with_horovod_built_without_mpi(
    monkeypatch: pytest.MonkeyPatch, fake_horovod: Path
) -> None:
    monkeypatch.setattr(hb.shutil, "which", lambda name: "/usr/bin/mpirun")
    with pytest.raises(ConfigurationError, match="needs Horovod built with MPI"):
        get_backend("horovod").check(RunConfig(np=2, backend="horovod", launcher="mpi"))


@pytest.mark.skipif(not OPEN_MPI_LIBRARY.exists(), reason=f"no Open MPI ({OPEN_MPI_LIBRARY})")
def test_check_mpi_with_everything_passes(
    monkeypatch: pytest.MonkeyPatch, fake_horovod: Path
) -> None:
    fake_horovod.unlink()
    fake_horovod.symlink_to(OPEN_MPI_LIBRARY)  # an extension linked against libmpi
    looked_up: list[str] = []
    monkeypatch.setattr(hb.shutil, "which", lambda name: looked_up.append(name) or "/x/mpirun")
    config = RunConfig(np=2, backend="horovod", launcher="mpi")
    get_backend("horovod").check(config)
    assert looked_up == ["mpirun"]  # it looked for mpirun, and found the extension links MPI
    assert hi._links_mpi(fake_horovod) is True
    assert hi.builtin_reason(config) is None


# -- the built-in horovod.torch (sparktrain.hvdcompat) --------------------------------------


@pytest.mark.parametrize("launcher", [None, "gloo"])
def test_auto_without_horovod_uses_the_builtin_one(
    monkeypatch: pytest.MonkeyPatch, launcher: str | None
) -> None:
    _no_horovod(monkeypatch)
    config = RunConfig(np=2, backend="horovod", launcher=launcher)
    backend = get_backend("horovod")
    backend.check(config)
    spec = spec_of(["10.0.0.1", "10.0.0.2"], ifname="eth0")
    shared = backend.prepare(spec, config)
    try:
        assert shared == {contract.HOROVOD_SHIM_ENV: "Horovod is not installed"}
        env = backend.env(spec, spec.ranks[1], shared, config)
    finally:
        backend.teardown()
    assert env == {
        "HOROVOD_HOSTNAME": "10.0.0.2",
        "HOROVOD_RANK": "1",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
        contract.HOROVOD_SHIM_ENV: "Horovod is not installed",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "5000",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
    }
    # torch.distributed's collective defaults, as the torch backend gives them; not for Horovod.
    assert backend.env_defaults(env) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert backend.env_defaults({**env, "NCCL_ASYNC_ERROR_HANDLING": "0"}) == {}
    assert backend.env_defaults(backend.env(spec, spec.ranks[1], SHARED, config)) == {}


def test_builtin_setting_wins_over_installed_horovod(fake_horovod: Path) -> None:
    config = RunConfig(np=2, backend="horovod", horovod_impl="builtin")
    get_backend("horovod").check(config)
    reason = hi.builtin_reason(config)
    assert reason == "chosen by horovod_impl='builtin' (spark.sparktrain.horovodImpl)"
    assert hi.builtin_reason(RunConfig(np=2, backend="horovod")) is None  # auto: the real one


def test_builtin_with_mpi_launcher_is_refused() -> None:
    config = RunConfig(np=2, backend="horovod", launcher="mpi", horovod_impl="builtin")
    with pytest.raises(ConfigurationError, match="use launcher='gloo', or horovod_impl='horovod'"):
        get_backend("horovod").check(config)


def test_unknown_horovod_impl_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="horovod_impl must be one of horovod, builtin"):
        RunConfig(np=2, backend="horovod", horovod_impl="fake")
    resolved = RunConfig.resolve(2, environ={"SPARKTRAIN_HOROVOD_IMPL": "auto"})
    assert resolved.horovod_impl is None
