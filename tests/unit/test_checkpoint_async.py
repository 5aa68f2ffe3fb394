"""Asynchronous checkpoint saves: ``save(..., asynchronous=True)`` stages, then writes behind.

In process, the checkpoint store's ``write`` is wrapped so that writing a data file waits for
an event the test sets: so ``save`` is seen to return while the data is not yet written
(no timing), the tensors are changed before the write, and the next ``save`` is seen to wait.
A background write that fails (a full target: the write raises ENOSPC) surfaces at the next
save, at ``wait()`` and, through ``SparkRunner(np=-2)``, when the rank's function returns,
with the step named. So does a failed sharded background write (an fsspec store whose disk is
full for the shards), its cause on one line with the rank named instead of DCP's multi-line
wrapper; and a real read-only folder (written by another account, since root ignores a
folder's mode) fails whole and sharded background writes with the OS's PermissionError.
Sharded asynchronous saves of an FSDP model at 2 ranks (gloo) load back identical to the state
at the instant of the save.
"""

from __future__ import annotations

import errno
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

torch = pytest.importorskip("torch")

from sparktrain import SparkRunner, checkpoint  # noqa: E402
from sparktrain.checkpoint import _background, _store  # noqa: E402
from sparktrain.errors import WorkerFailedError  # noqa: E402
from tests.accounts import Account, need_python  # noqa: E402

_real_write = _store._Store.write


@pytest.fixture(autouse=True)
def _run_and_settle(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "async-run")
    yield
    try:
        _background.settle()  # no save of one test is left in flight for the next
    except checkpoint.CheckpointError:
        pass


class _Gate:
    """Wraps the store's write: records the order of writes, and holds data files back
    until ``opened`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = threading.Event()
        self.log: list[str] = []
        gate = self

        def write(store: Any, name: str, fill: Callable[[IO[bytes]], object]) -> None:
            if name.endswith(".pt"):
                gate.log.append(f"begin {name.split('.')[0]}")
                gate.opened.wait()
            _real_write(store, name, fill)
            gate.log.append(f"wrote {name}")

        monkeypatch.setattr(_store._Store, "write", write)


def _markers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.commit.json"))


def test_save_returns_while_the_write_waits_and_saves_the_staged_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(monkeypatch)
    directory = tmp_path / "ckpt"
    weights = torch.arange(6, dtype=torch.float32)
    state = {"w": weights, "tied": weights, "epoch": 1, "nested": [{"b": torch.ones(2)}]}

    handle = checkpoint.save(state, directory, 5, asynchronous=True)

    assert isinstance(handle, checkpoint.PendingSave)
    assert (handle.step, handle.path) == (5, None)
    assert not handle.done() and handle.exception() is None
    with pytest.raises(TimeoutError, match="step 5 .* still writing"):
        handle.wait(timeout=0)
    assert _markers(directory) == []  # nothing is committed while the write waits
    weights.mul_(-1)  # training goes on and changes the tensors
    state["nested"][0]["b"].zero_()
    state["epoch"] = 2

    gate.opened.set()
    path = handle.wait()

    assert handle.done() and handle.exception() is None and handle.path == path
    assert path is not None and path.startswith(str(directory))
    assert "committed" in repr(handle)
    loaded = checkpoint.load_latest(directory)
    assert loaded is not None and loaded.step == 5 and loaded.path == path
    assert torch.equal(loaded.state["w"], torch.arange(6, dtype=torch.float32))
    assert loaded.state["tied"] is loaded.state["w"]  # one tensor twice stays one
    assert torch.equal(loaded.state["nested"][0]["b"], torch.ones(2))
    assert loaded.state["epoch"] == 1


def test_the_next_save_waits_for_the_one_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(monkeypatch)
    directory = tmp_path / "ckpt"
    first = checkpoint.save({"w": torch.zeros(3)}, directory, 1, asynchronous=True)
    seen: list[bool] = []
    real_settle = _background.settle

    def settle(timeout: float | None = None) -> None:
        if not seen:
            seen.append(first.done())  # when the next save begins, the first still writes
            gate.opened.set()
        real_settle(timeout)

    monkeypatch.setattr(_background, "settle", settle)

    path = checkpoint.save({"w": torch.ones(3)}, directory, 2)  # a synchronous one

    assert seen == [False] and first.done() and first.exception() is None
    one, two = "wrote step-000000000001.commit.json", "begin step-000000000002"
    assert gate.log.index(one) < gate.log.index(two), gate.log
    assert _markers(directory) == [
        "step-000000000001.commit.json",
        "step-000000000002.commit.json",
    ]
    assert path == checkpoint.load_latest(directory).path  # type: ignore[union-attr]


def _full_disk(monkeypatch: pytest.MonkeyPatch, steps: tuple[int, ...]) -> None:
    """Writing the data file of one of ``steps`` fails: the disk is full."""
    full = tuple(f"step-{step:012d}." for step in steps)

    def write(store: Any, name: str, fill: Callable[[IO[bytes]], object]) -> None:
        if name.endswith(".pt") and name.startswith(full):
            raise OSError(errno.ENOSPC, "No space left on device", name)
        _real_write(store, name, fill)

    monkeypatch.setattr(_store._Store, "write", write)


def test_a_failed_background_write_raises_at_the_next_save_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "ckpt"
    checkpoint.save({"w": torch.zeros(2)}, directory, 1)
    _full_disk(monkeypatch, (2,))  # step 3 finds room again
    handle = checkpoint.save({"w": torch.ones(2)}, directory, 2, asynchronous=True)

    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.save({"w": torch.full((2,), 3.0)}, directory, 3)

    message = str(caught.value)
    assert "checkpoint save of step 2" in message and str(directory) in message
    assert "OSError" in message and "No space left on device" in message
    assert isinstance(caught.value.__cause__, OSError)
    assert handle.done() and isinstance(handle.exception(), checkpoint.CheckpointError)
    assert _markers(directory) == ["step-000000000001.commit.json"]  # 3 was not started
    # Raised once: the save after it goes through, and nothing is raised again.
    assert checkpoint.save({"w": torch.full((2,), 3.0)}, directory, 3) is not None
    checkpoint.wait()
    loaded = checkpoint.load_latest(directory)
    assert loaded is not None and loaded.step == 3


def test_wait_raises_the_failure_and_checkpoint_wait_does_not_repeat_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _full_disk(monkeypatch, (4, 5))
    handle = checkpoint.save({"w": torch.ones(2)}, tmp_path / "ckpt", 4, asynchronous=True)
    with pytest.raises(checkpoint.CheckpointError, match="step 4 .*No space left on device"):
        handle.wait()
    checkpoint.wait()  # already raised to the user by handle.wait()

    checkpoint.save({"w": torch.ones(2)}, tmp_path / "ckpt", 5, asynchronous=True)
    with pytest.raises(checkpoint.CheckpointError, match="step 5 .*No space left on device"):
        checkpoint.wait()


def _fail_at_the_end(directory: str, exit_zero: bool) -> str:
    """Save asynchronously into a full store, and return (or ``sys.exit(0)``) before the
    write is done."""
    import fsspec
    import torch.distributed as dist
    from fsspec.implementations.memory import MemoryFileSystem

    class FullFileSystem(MemoryFileSystem):
        protocol = "fullfs"
        store: dict[str, Any] = {}
        pseudo_dirs = [""]

        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            if "w" in mode and path.endswith(".pt"):
                raise OSError(errno.ENOSPC, "No space left on device", path)
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("fullfs", FullFileSystem, clobber=True)
    dist.init_process_group("gloo")
    checkpoint.save({"w": torch.ones(4)}, directory, 7, asynchronous=True)
    if exit_zero:
        sys.exit(0)
    return "returned"


@pytest.mark.parametrize("exit_zero", [False, True], ids=["return", "sys.exit(0)"])
def test_a_failed_background_write_fails_the_run_when_the_function_returns(
    exit_zero: bool,
) -> None:
    with pytest.raises(WorkerFailedError) as caught:
        SparkRunner(np=-2, progress=False).run(_fail_at_the_end, "fullfs://ckpt", exit_zero)
    message = str(caught.value)
    assert "asynchronous checkpoint save of step 7" in message, message
    assert "No space left on device" in message, message


def _fsdp_state() -> tuple[Any, Any, Callable[[], dict[str, Any]]]:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = FSDP(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
        device_id=torch.device("cpu"),
    )
    optim = torch.optim.Adam(model.parameters(), lr=0.01)

    def state() -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(model, optim)
        return {"model": model_sd, "optim": optim_sd}

    return model, optim, state


def _local(value: Any) -> Any:
    """Every tensor of ``value`` as a plain tensor of this rank's part, cloned."""
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_local(v) for v in value]
    if hasattr(value, "to_local"):
        return value.to_local().detach().clone()
    if hasattr(value, "local_tensor"):  # a ShardedTensor
        return value.local_tensor().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def _train_and_save_async(directory: str) -> list[dict[str, Any]]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    model, optim, fsdp_state = _fsdp_state()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    spread = distribute_tensor(torch.arange(8, dtype=torch.float32), mesh, [Shard(0)])

    def state() -> dict[str, Any]:
        return {**fsdp_state(), "spread": spread}

    def step(seed: int) -> None:
        torch.manual_seed(seed + dist.get_rank())
        model(torch.randn(5, 8)).pow(2).sum().backward()
        optim.step()
        optim.zero_grad()

    step(10)
    saved = _local(state())
    handle = checkpoint.save(state(), directory, 1, sharded=True, asynchronous=True)
    step(20)  # changes the parameters while (or before) the shards are written
    spread.to_local().add_(100)
    path = handle.wait()
    changed = _local(state())
    into = state()
    loaded = checkpoint.load_latest(directory, into=into)
    assert loaded is not None
    step(30)
    checkpoint.save(state(), directory, 2, sharded=True, asynchronous=True)
    seen = {
        "rank": dist.get_rank(),
        "path": path,
        "step": loaded.step,
        "same": _same(_local(into), saved),
        "differs": not _same(changed, saved),
    }
    seen_by = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(seen_by, seen)
    return seen_by  # with the save of step 2 in flight: the rank's end waits for it


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return bool(torch.equal(a, b))
    return bool(a == b)


def test_sharded_asynchronous_saves_at_two_ranks_load_back_identical(tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    zero, one = SparkRunner(np=-2, progress=False).run(_train_and_save_async, directory)
    assert zero["path"] is not None and zero["path"].endswith(".dcp")
    assert one["path"] is None  # what a synchronous save returns on rank 1
    for rank in (zero, one):
        assert rank["step"] == 1 and rank["differs"], rank
        assert rank["same"], rank  # the state at save time, not the one trained after
    assert _markers(Path(directory)) == [
        "step-000000000001.commit.json",
        "step-000000000002.commit.json",
    ]


def _full_shards(protocol: str, steps: tuple[int, ...] | None = None) -> Any:
    """Register ``protocol``, an in-memory store whose disk is full for the shards (``.distcp``
    files) of sharded checkpoints of ``steps`` (None: of every step); its file system."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    full = None if steps is None else tuple(f"step-{step:012d}." for step in steps)

    class FullFileSystem(MemoryFileSystem):
        store: dict[str, Any] = {}
        pseudo_dirs = [""]

        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            folder, _, name = path.rpartition("/")
            mine = full is None or folder.rpartition("/")[2].startswith(full)
            if "w" in mode and name.endswith(".distcp") and mine:
                raise OSError(errno.ENOSPC, "No space left on device", path)
            return super()._open(path, mode, **kwargs)

    FullFileSystem.protocol = protocol
    fsspec.register_implementation(protocol, FullFileSystem, clobber=True)
    return fsspec.filesystem(protocol)


def test_a_failed_sharded_background_write_raises_at_the_next_save_on_one_line(
    tmp_path: Path,
) -> None:
    fs = _full_shards("fullshards", (2,))  # step 3 finds room again
    directory = f"fullshards://{tmp_path.name}"
    checkpoint.save({"w": torch.zeros(2)}, directory, 1, sharded=True)
    handle = checkpoint.save({"w": torch.ones(2)}, directory, 2, sharded=True, asynchronous=True)

    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.save({"w": torch.full((2,), 3.0)}, directory, 3, sharded=True)

    message = str(caught.value)
    assert message.startswith(
        f"asynchronous checkpoint save of step 2 to {directory} failed in the background: "
        "OSError: [Errno 28] No space left on device: "
    ), message
    # DCP's wrapper (every failed rank's traceback) is reduced to the cause, on one line.
    assert "__0_0.distcp' (rank 0); it was not committed" in message, message
    assert "\n" not in message and "CheckpointException" not in message, message
    # The chain is kept for the traceback: DCP's exception, holding rank 0's OSError.
    failures = getattr(caught.value.__cause__, "failures", {})
    assert isinstance(failures[0][0], OSError) and failures[0][0].errno == errno.ENOSPC
    assert handle.done() and isinstance(handle.exception(), checkpoint.CheckpointError)
    markers = sorted(k.rpartition("/")[2] for k in fs.store if k.endswith(".commit.json"))
    assert markers == ["step-000000000001.commit.json"]
    # Raised once: the save after it goes through, and nothing is raised again.
    assert checkpoint.save({"w": torch.full((2,), 3.0)}, directory, 3, sharded=True)
    checkpoint.wait()
    into = {"w": torch.zeros(2)}
    loaded = checkpoint.load_latest(directory, into=into)
    assert loaded is not None and loaded.step == 3 and torch.equal(into["w"], torch.full((2,), 3.0))


def _fail_sharded_at_the_end(directory: str) -> str:
    """Save a sharded checkpoint asynchronously into a store whose disk is full, and return
    before the write is done."""
    import torch.distributed as dist

    _full_shards(directory.partition(":")[0])
    dist.init_process_group("gloo")
    checkpoint.save({"w": torch.ones(4)}, directory, 7, sharded=True, asynchronous=True)
    return "returned"


def test_a_failed_sharded_background_write_fails_the_run_when_the_function_returns() -> None:
    with pytest.raises(WorkerFailedError) as caught:
        SparkRunner(np=-2, progress=False).run(_fail_sharded_at_the_end, "fullshards://ckpt")
    message = str(caught.value)
    said = [line for line in message.splitlines() if "checkpoint save of step 7" in line]
    assert said, message
    # Each rank names its own cause, on the line that names the step; DCP's wrapper is gone.
    assert re.search(
        r"asynchronous checkpoint save of step 7 to fullshards://ckpt failed in the "
        r"background: OSError: \[Errno 28\] No space left on device: \S+ \(rank 0\); "
        r"OSError: \[Errno 28\] No space left on device: \S+ \(rank 1\); it was not committed",
        said[0],
    ), message


_AS_ANOTHER_ACCOUNT = """
import json, os, torch
from sparktrain import checkpoint

os.environ[checkpoint.RUN_ID_ENV] = "read-only-run"
seen = {}
for kind in ("whole", "sharded"):
    directory = os.path.join(os.environ["ROOT"], kind)
    sharded = kind == "sharded"
    checkpoint.save({"w": torch.zeros(4)}, directory, 1, sharded=sharded)
    os.chmod(directory, 0o555)  # its owner (not root) can no longer write into it
    handle = checkpoint.save({"w": torch.ones(4)}, directory, 2, sharded=sharded,
                             asynchronous=True)
    try:
        checkpoint.save({"w": torch.ones(4)}, directory, 3, sharded=sharded)
        error = None
    except checkpoint.CheckpointError as exc:
        error = str(exc)
    into = {"w": torch.full((4,), -1.0)}
    ckpt = checkpoint.load_latest(directory, **({"into": into} if sharded else {}))
    state = into if sharded else ckpt.state
    seen[kind] = {"returned": type(handle).__name__, "error": error, "loaded": ckpt.step,
                  "w": state["w"].tolist(), "names": sorted(os.listdir(directory))}
print(json.dumps(seen))
"""


def test_a_read_only_target_fails_the_background_write_and_the_next_save_says_so(
    tmp: Path, other: Account
) -> None:
    # As root, a folder's mode does not stop writes: the save runs as another account.
    need_python(other)
    root = tmp / "ckpt"
    other.run("mkdir", str(root))
    done = other.python(_AS_ANOTHER_ACCOUNT, env={"ROOT": str(root), "TMPDIR": str(tmp)})
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    for kind in ("whole", "sharded"):
        got = seen[kind]
        assert got["returned"] == "PendingSave", got  # the failure comes later, in the background
        error = got["error"]
        assert error is not None and "\n" not in error, got
        assert error.startswith(
            f"asynchronous checkpoint save of step 2 to {root / kind} failed in the background: "
            "PermissionError: [Errno 13] Permission denied: "
        ), error
        assert error.endswith(
            "; it was not committed, so load_latest still finds the checkpoint before it, if any"
        ), error
        assert got["loaded"] == 1 and got["w"] == [0.0] * 4, got
        assert [n for n in got["names"] if n.endswith(".commit.json")] == [
            "step-000000000001.commit.json"
        ], got
    assert seen["sharded"]["error"].count("(rank 0)") == 1, seen["sharded"]["error"]


def test_ranks_whose_background_writes_failed_alike_are_named_together() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(errno.ENOSPC, "No space left on device")
    denied = PermissionError(errno.EACCES, "Permission denied")
    failures = {2: (denied, []), 0: (full, []), 1: (full, [])}
    dcp_error = CheckpointException("CheckpointException ranks:dict_keys([0, 1, 2])", failures)

    assert _background.describe(dcp_error) == (
        "OSError: [Errno 28] No space left on device (ranks 0, 1); "
        "PermissionError: [Errno 13] Permission denied (rank 2)"
    )
    assert _background.describe(full) == "OSError: [Errno 28] No space left on device"
