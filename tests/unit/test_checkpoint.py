"""sparktrain.checkpoint on local paths, file:// and memory:// URLs (no Spark, no network)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sparktrain import checkpoint  # noqa: E402
from sparktrain.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointOwnershipError,
    CheckpointWarning,
)
from sparktrain.errors import ConfigurationError, SparkTrainError  # noqa: E402


class Opaque:
    """Not loadable with weights_only=True."""

    def __init__(self, value: int) -> None:
        self.value = value


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "run-A")


def state(step: int) -> dict[str, Any]:
    return {"step": step, "w": torch.arange(8, dtype=torch.float32) * step}


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def markers(directory: Path) -> list[str]:
    return [n for n in names(directory) if n.endswith(".commit.json")]


def data_of(directory: Path, step: int) -> Path:
    marker = json.loads((directory / f"step-{step:012d}.commit.json").read_text())
    return directory / marker["data"]


def test_round_trip(tmp_path: Path) -> None:
    path = checkpoint.save(state(3), tmp_path, 3)
    checkpoint.save(state(10), tmp_path, 10)
    checkpoint.save(state(7), tmp_path / "other", 7)
    assert path is not None and Path(path).is_file() and Path(path).parent == tmp_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None
    assert ckpt.step == 10 and ckpt.state["step"] == 10
    assert torch.equal(ckpt.state["w"], state(10)["w"])
    assert ckpt.path == str(data_of(tmp_path, 10))
    step, loaded, _ = ckpt  # a plain tuple too
    assert step == 10 and loaded["step"] == 10
    assert markers(tmp_path) == ["step-000000000003.commit.json", "step-000000000010.commit.json"]


def test_nothing_there(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint.load_latest(tmp_path / "absent") is None
        assert checkpoint.load_latest(tmp_path) is None


def test_other_ranks_do_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    assert checkpoint.save(state(1), tmp_path / "ckpt", 1, keep_last=1) is None
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(ConfigurationError, match="step"):  # arguments are checked everywhere
        checkpoint.save(state(1), tmp_path / "ckpt", -1)
    monkeypatch.setenv("RANK", "0")
    checkpoint.save(state(1), tmp_path / "ckpt", 1)
    monkeypatch.setenv("RANK", "1")
    ckpt = checkpoint.load_latest(tmp_path / "ckpt")  # every rank may load
    assert ckpt is not None and ckpt.step == 1


def test_keep_last_prunes_only_after_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in range(4):
        checkpoint.save(state(step), tmp_path, step, keep_last=2)
    assert markers(tmp_path) == ["step-000000000002.commit.json", "step-000000000003.commit.json"]
    assert len([n for n in names(tmp_path) if n.endswith(".pt")]) == 2

    events: list[str] = []
    real_write, real_remove = checkpoint._Store.write, checkpoint._Store.remove

    def write(self: Any, name: str, fill: Any) -> None:
        real_write(self, name, fill)
        events.append(f"write {name}")

    def remove(self: Any, name: str) -> None:
        events.append(f"remove {name}")
        real_remove(self, name)

    monkeypatch.setattr(checkpoint._Store, "write", write)
    monkeypatch.setattr(checkpoint._Store, "remove", remove)
    checkpoint.save(state(4), tmp_path, 4, keep_last=1)
    commit = events.index("write step-000000000004.commit.json")
    removed = [i for i, e in enumerate(events) if e.startswith("remove")]
    assert len(removed) == 4  # markers and data of steps 2 and 3
    assert min(removed) > commit
    assert markers(tmp_path) == ["step-000000000004.commit.json"]

    # A commit that fails prunes nothing.
    def failing_write(self: Any, name: str, fill: Any) -> None:
        if name.endswith(".commit.json"):
            raise OSError("disk full")
        real_write(self, name, fill)

    monkeypatch.setattr(checkpoint._Store, "write", failing_write)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(state(5), tmp_path, 5, keep_last=1)
    with pytest.warns(CheckpointWarning, match="step-000000000005.*no commit marker"):
        ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 4


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    checkpoint.save({"v": 1}, tmp_path, 5)
    checkpoint.save({"v": 2}, tmp_path, 5)
    assert len([n for n in names(tmp_path) if n.endswith(".pt")]) == 1
    ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.state == {"v": 2}


def test_saving_below_newest_step_warns(tmp_path: Path) -> None:
    checkpoint.save(state(9), tmp_path, 9)
    with pytest.warns(CheckpointWarning, match=r"newer step\(s\) \[9\]"):
        checkpoint.save(state(4), tmp_path, 4)
    ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 9


def test_uncommitted_is_skipped(tmp_path: Path) -> None:
    checkpoint.save(state(1), tmp_path, 1)
    # What a save of step 2 killed before its marker leaves: complete data, partial data.
    orphan = tmp_path / "step-000000000002.00112233aabbccdd.pt"
    torch.save(state(2), orphan)
    (tmp_path / ".step-000000000003.0123456789abcdef.pt.0badf00d.partial").write_bytes(b"PK")
    with pytest.warns(CheckpointWarning) as record:
        ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1
    messages = [str(w.message) for w in record]
    assert any(str(orphan) in m and "no commit marker" in m for m in messages)
    assert any(".partial" in m for m in messages)
    # The next save clears both leftovers.
    checkpoint.save(state(4), tmp_path, 4)
    assert not orphan.exists()
    assert not [n for n in names(tmp_path) if n.endswith(".partial")]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", "corrupted"),
        ("truncate", "truncated"),
        ("delete", "missing"),
        ("marker", "unreadable"),
        ("marker-step", "malformed"),
    ],
)
def test_damaged_newest_falls_back(tmp_path: Path, damage: str, reason: str) -> None:
    checkpoint.save(state(1), tmp_path, 1)
    checkpoint.save(state(2), tmp_path, 2)
    data = data_of(tmp_path, 2)
    marker = tmp_path / "step-000000000002.commit.json"
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-7])
    elif damage == "delete":
        data.unlink()
    elif damage == "marker":
        marker.write_text(marker.read_text()[:20])
    else:
        marker.write_text(json.dumps(dict(json.loads(marker.read_text()), step=3)))
    with pytest.warns(CheckpointWarning, match=reason) as record:
        ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1 and ckpt.state["step"] == 1
    assert any(str(marker) in str(w.message) for w in record)


def test_all_damaged_gives_none(tmp_path: Path) -> None:
    checkpoint.save(state(1), tmp_path, 1)
    data_of(tmp_path, 1).write_bytes(b"")
    with pytest.warns(CheckpointWarning, match="truncated"):
        assert checkpoint.load_latest(tmp_path) is None


def test_intact_but_unloadable_raises(tmp_path: Path) -> None:
    checkpoint.save({"obj": Opaque(3)}, tmp_path, 1)
    with pytest.raises(CheckpointError, match="weights_only=False") as info:
        checkpoint.load_latest(tmp_path)
    assert isinstance(info.value, SparkTrainError)
    ckpt = checkpoint.load_latest(tmp_path, weights_only=False)
    assert ckpt is not None and ckpt.state["obj"].value == 3


def test_file_url(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    path = checkpoint.save(state(2), url, 2, keep_last=1)
    checkpoint.save(state(3), url, 3, keep_last=1)
    assert path is not None and path.startswith(url + "/step-000000000002.")
    ckpt = checkpoint.load_latest(url, map_location="cpu")
    assert ckpt is not None and ckpt.step == 3 and ckpt.path.startswith(url + "/")
    assert markers(tmp_path / "ckpt") == ["step-000000000003.commit.json"]
    same = checkpoint.load_latest(tmp_path / "ckpt")
    assert same is not None and same.step == 3


@pytest.fixture
def memory_url() -> Any:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://ckpt-{uuid.uuid4().hex}/run"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def test_memory_url(memory_url: str) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    for step in range(3):
        checkpoint.save(state(step), memory_url, step, keep_last=2)
    listing = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(memory_url, detail=False))
    assert [n for n in listing if n.endswith(".commit.json")] == [
        "step-000000000001.commit.json",
        "step-000000000002.commit.json",
    ]
    ckpt = checkpoint.load_latest(memory_url)
    assert ckpt is not None and ckpt.step == 2 and ckpt.path.startswith(memory_url + "/")
    assert torch.equal(ckpt.state["w"], state(2)["w"])
    # A truncated data object is caught by the size in the marker.
    fs.pipe_file(ckpt.path, fs.cat_file(ckpt.path)[:-1])
    with pytest.warns(CheckpointWarning, match="truncated"):
        older = checkpoint.load_latest(memory_url)
    assert older is not None and older.step == 1


def test_failed_save_leaves_nothing(memory_url: str) -> None:
    import fsspec

    checkpoint.save(state(1), memory_url, 1)
    before = sorted(fsspec.filesystem("memory").ls(memory_url, detail=False))
    with pytest.raises(Exception, match="lambda|pickle"):
        checkpoint.save({"f": lambda: 0}, memory_url, 2)
    assert sorted(fsspec.filesystem("memory").ls(memory_url, detail=False)) == before


def test_url_without_fsspec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(ConfigurationError, match="pip install fsspec"):
        checkpoint.load_latest("s3://bucket/run")


def test_second_run_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint.save(state(1), tmp_path, 1)
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "run-B")
    with pytest.raises(CheckpointOwnershipError) as info:
        checkpoint.save(state(2), tmp_path, 2)
    message = str(info.value)
    assert "'run-A'" in message and "'run-B'" in message
    assert "another directory" in message and "take_over=True" in message
    assert isinstance(info.value, ConfigurationError)
    assert markers(tmp_path) == ["step-000000000001.commit.json"]


def write_owner(directory: Path, **record: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / checkpoint.OWNER_FILE).write_text(json.dumps(record))


def test_restarted_attempt_continues(tmp_path: Path) -> None:
    # The first attempt of run-A ran elsewhere; this process is its restart.
    write_owner(tmp_path, run_id="run-A", host="executor-7", pid=4242, since=time.time())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint.save(state(5), tmp_path, 5)
    owner = json.loads((tmp_path / checkpoint.OWNER_FILE).read_text())
    assert owner["run_id"] == "run-A" and owner["pid"] == os.getpid()
    assert owner["host"] == socket.gethostname()


def test_take_over_an_ended_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_owner(tmp_path, run_id="run-old", host="executor-7", pid=4242, since=1.0)
    with pytest.raises(CheckpointOwnershipError, match="run-old"):
        checkpoint.save(state(1), tmp_path, 1)
    caplog.set_level(logging.INFO, logger="sparktrain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: logged, not a warning
        checkpoint.save(state(1), tmp_path, 1, take_over=True)
    assert re.search(r"taking over .* run 'run-old'.*\(take_over=True\)", caplog.text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint.save(state(2), tmp_path, 2, take_over=True)  # ours now: no new warning
    owner = json.loads((tmp_path / checkpoint.OWNER_FILE).read_text())
    assert owner["run_id"] == "run-A"


def test_take_over_never_displaces_a_newer_run(tmp_path: Path) -> None:
    # Claimed after this process started: live or newer, whatever take_over says.
    write_owner(tmp_path, run_id="run-new", host="executor-7", pid=4242, since=time.time())
    with pytest.raises(CheckpointOwnershipError, match="after this process started"):
        checkpoint.save(state(1), tmp_path, 1, take_over=True)
    assert markers(tmp_path) == []


def test_dead_owner_on_this_host_is_replaced(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_owner(tmp_path, run_id="run-old", host=socket.gethostname(), pid=gone.pid, since=1.0)
    with pytest.warns(CheckpointWarning, match="its process is gone; pass take_over=True"):
        checkpoint.save(state(1), tmp_path, 1)
    ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1


def test_takeover_during_save_is_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save(state(1), tmp_path, 1)
    real_write = checkpoint._Store.write

    def write(self: Any, name: str, fill: Any) -> None:
        real_write(self, name, fill)
        if name.endswith(".pt"):  # another run claims the directory during our upload
            write_owner(tmp_path, run_id="run-B", host="h", pid=1, since=time.time())

    monkeypatch.setattr(checkpoint._Store, "write", write)
    with pytest.raises(CheckpointOwnershipError, match="run-B"):
        checkpoint.save(state(2), tmp_path, 2)
    assert markers(tmp_path) == ["step-000000000001.commit.json"]
    assert len([n for n in names(tmp_path) if n.endswith(".pt")]) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step": -1}, "step must be >= 0"),
        ({"step": 1.5}, "step must be an int"),
        ({"step": "3"}, "step must be an int"),
        ({"step": True}, "step must be an int"),
        ({"step": None}, "step must be an int"),
        ({"step": 1, "keep_last": 0}, "keep_last"),
        ({"step": 1, "keep_last": -2}, "keep_last"),
        ({"step": 1, "keep_last": 2.0}, "keep_last"),
        ({"step": 1, "keep_last": True}, "keep_last"),
        ({"step": 1, "directory": ""}, "non-empty path"),
        ({"step": 1, "directory": None}, "non-empty path"),
    ],
)
def test_bad_input_fails_before_any_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], match: str
) -> None:
    def no_io(*args: Any, **kw: Any) -> None:
        raise AssertionError("I/O before argument checks")

    monkeypatch.setattr(checkpoint, "_Store", no_io)
    directory = kwargs.pop("directory", tmp_path / "ckpt")
    with pytest.raises(ConfigurationError, match=match):
        checkpoint.save(state(1), directory, kwargs.pop("step"), **kwargs)
    assert not (tmp_path / "ckpt").exists()


def test_pruned_while_loading_lists_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint.save(state(1), tmp_path, 1)
    stale = names(tmp_path)  # what a reader listed just before rank 0 saved and pruned
    checkpoint.save(state(2), tmp_path, 2, keep_last=1)
    listings = [stale]
    real_names = checkpoint._Store.names

    def names_once_stale(self: Any) -> list[str] | None:
        return listings.pop() if listings else real_names(self)

    monkeypatch.setattr(checkpoint._Store, "names", names_once_stale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt = checkpoint.load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 2
    assert not listings
