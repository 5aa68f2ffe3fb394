"""keep_last counts intact checkpoints only: damaged ones never displace an intact one.

The damage is real: data files truncated or with flipped bytes, commit markers cut short.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sparktrain import checkpoint  # noqa: E402
from sparktrain.checkpoint import CheckpointWarning  # noqa: E402

OWNER = checkpoint.OWNER_FILE


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "run-A")


@dataclass
class Directory:
    """A checkpoint directory on a local disk or in fsspec's memory filesystem."""

    url: str
    fs: Any = None  # None: local

    def names(self) -> list[str]:
        if self.fs is None:
            return sorted(p.name for p in Path(self.url).iterdir())
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.url, detail=False))

    def read(self, name: str) -> bytes:
        if self.fs is None:
            return (Path(self.url) / name).read_bytes()
        return bytes(self.fs.cat_file(f"{self.url}/{name}"))

    def write(self, name: str, raw: bytes) -> None:
        if self.fs is None:
            (Path(self.url) / name).write_bytes(raw)
        else:
            self.fs.pipe_file(f"{self.url}/{name}", raw)

    def data(self, step: int) -> str:
        return str(json.loads(self.read(marker(step)))["data"])

    def files(self, step: int) -> list[str]:
        return sorted([marker(step), self.data(step)])

    def truncate_data(self, step: int) -> None:
        name = self.data(step)
        self.write(name, self.read(name)[:-100])

    def flip_data(self, step: int) -> None:
        name = self.data(step)
        raw = bytearray(self.read(name))
        raw[len(raw) // 2] ^= 0xFF  # same size: only the SHA-256 tells
        self.write(name, bytes(raw))

    def break_marker(self, step: int) -> None:
        self.write(marker(step), self.read(marker(step))[:25])


@pytest.fixture(params=["local", "memory"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Directory]:
    if request.param == "local":
        yield Directory(str(tmp_path / "ckpt"))
        return
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    url = f"memory://retention-{uuid.uuid4().hex}/run"
    yield Directory(url, fs)
    if fs.exists(url):
        fs.rm(url, recursive=True)


def marker(step: int) -> str:
    return f"step-{step:012d}.commit.json"


def state(step: int, version: int = 0) -> dict[str, Any]:
    return {"step": step, "version": version, "w": torch.arange(4096, dtype=torch.float32)}


def save_steps(directory: Directory, steps: range) -> None:
    for step in steps:
        checkpoint.save(state(step), directory.url, step)


def test_resaving_below_damaged_newer_ones_keeps_the_intact_one(directory: Directory) -> None:
    # The directory that lost its intact step 1: steps 4 and 3 damaged, step 2's marker broken.
    save_steps(directory, range(1, 5))
    step1 = directory.files(1)
    step1_bytes = [directory.read(name) for name in step1]
    directory.truncate_data(4)
    directory.flip_data(3)
    directory.break_marker(2)

    with pytest.warns(CheckpointWarning) as record:
        saved = checkpoint.save(state(2, version=1), directory.url, 2, keep_last=2)

    assert saved is not None
    new_data = saved.rsplit("/", 1)[-1]
    assert directory.names() == sorted([OWNER, *step1, marker(2), new_data])
    assert [directory.read(name) for name in step1] == step1_bytes
    assert len(record) == 1, [str(w.message) for w in record]
    message = str(record[0].message)
    assert record[0].filename == __file__  # points at the save() call
    assert "damaged checkpoints, which keep_last does not count" in message
    assert "step 4 (" in message and "truncated" in message
    assert "step 3 (" in message and "corrupted" in message
    assert "deleted them" in message
    assert message.endswith("load_latest returns step 2")
    assert "newer step" not in message

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left to skip
        ckpt = checkpoint.load_latest(directory.url)
    assert ckpt is not None and ckpt.step == 2 and ckpt.state["version"] == 1
    assert ckpt.path == saved


def test_damaged_ones_are_not_counted(directory: Directory) -> None:
    save_steps(directory, range(1, 5))
    intact = directory.files(1) + directory.files(2)
    directory.flip_data(4)
    directory.truncate_data(3)
    with pytest.warns(CheckpointWarning, match=r"step 4 \(.*step 3 \(.*returns step 5$"):
        saved = checkpoint.save(state(5), directory.url, 5, keep_last=3)
    assert saved is not None
    # Three intact ones: the new step 5 and the two newest intact others.
    assert directory.names() == sorted([OWNER, *intact, marker(5), saved.rsplit("/", 1)[-1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt = checkpoint.load_latest(directory.url)
    assert ckpt is not None and ckpt.step == 5


def test_a_damaged_marker_is_not_counted(directory: Directory) -> None:
    save_steps(directory, range(1, 4))
    kept = directory.files(1)
    directory.break_marker(2)
    with pytest.warns(CheckpointWarning, match=r"step 2 \(the commit marker is unreadable"):
        checkpoint.save(state(4), directory.url, 4, keep_last=3)
    names = directory.names()
    assert [n for n in names if n.startswith("step-000000000002")] == []  # marker and data
    assert set(kept + directory.files(3) + directory.files(4)) < set(names)


def test_keep_every_one_leaves_damaged_ones_and_names_what_load_latest_returns(
    directory: Directory,
) -> None:
    save_steps(directory, range(1, 4))
    before = directory.names()
    directory.truncate_data(3)
    with pytest.warns(CheckpointWarning) as record:
        checkpoint.save(state(1, version=1), directory.url, 1)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    assert "step 3 (" in messages[0] and "left them in place" in messages[0]
    assert "newer step(s) [2]: load_latest returns step 2;" in messages[1]
    assert "returns step 2" in messages[0]
    assert len(directory.names()) == len(before)  # step 1's data was replaced, nothing else
    with pytest.warns(CheckpointWarning, match="step-000000000003.*truncated"):
        ckpt = checkpoint.load_latest(directory.url)
    assert ckpt is not None and ckpt.step == 2


def test_an_unreadable_one_stops_pruning(
    directory: Directory, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_steps(directory, range(1, 4))
    before = directory.names()
    hidden = directory.data(3)
    real_open = checkpoint._Store.open

    def failing_open(self: Any, name: str) -> Any:
        if name == hidden:
            raise PermissionError(13, "Permission denied", name)
        return real_open(self, name)

    monkeypatch.setattr(checkpoint._Store, "open", failing_open)
    with pytest.warns(CheckpointWarning) as record:
        saved = checkpoint.save(state(4), directory.url, 4, keep_last=2)
    assert saved is not None
    assert directory.names() == sorted([*before, *directory.files(4)])  # nothing deleted
    messages = [str(w.message) for w in record]
    assert len(messages) == 1, messages
    assert "could not check step 3 (" in messages[0] and "Permission denied" in messages[0]
    assert "deleted no checkpoint (keep_last=2 applies again" in messages[0]
    assert messages[0].endswith("load_latest returns step 4")

    monkeypatch.setattr(checkpoint._Store, "open", real_open)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saved = checkpoint.save(state(5), directory.url, 5, keep_last=2)
    assert saved is not None
    assert directory.names() == sorted([OWNER, *directory.files(4), *directory.files(5)])


def test_an_unreadable_newer_one_is_named(
    directory: Directory, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_steps(directory, range(1, 4))
    real_read = checkpoint._Store.read

    def failing_read(self: Any, name: str) -> bytes:
        if name == marker(3):
            raise OSError(5, "Input/output error", name)
        return bytes(real_read(self, name))

    monkeypatch.setattr(checkpoint._Store, "read", failing_read)
    with pytest.warns(CheckpointWarning) as record:
        checkpoint.save(state(2, version=1), directory.url, 2)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    assert "could not check step 3 (the commit marker is unreadable" in messages[0]
    assert "deleted no checkpoint" not in messages[0]  # keep_last=None deletes nothing anyway
    expected = "load_latest returns step 2, or one of the newer step(s) [3] if it can be read"
    assert expected in messages[0] and expected in messages[1]
    assert "newer step(s) [3]" in messages[1]


def test_keep_last_one_deletes_newer_ones_and_says_so(directory: Directory) -> None:
    save_steps(directory, range(5, 8))
    with pytest.warns(CheckpointWarning) as record:
        saved = checkpoint.save(state(2), directory.url, 2, keep_last=1)
    assert [str(w.message) for w in record] == [
        f"saved step 2 into {directory.url}, keep_last=1 deleted its newer step(s) [5, 6, 7]: "
        "load_latest returns step 2"
    ]
    assert saved is not None
    assert directory.names() == sorted([OWNER, *directory.files(2)])
    ckpt = checkpoint.load_latest(directory.url)
    assert ckpt is not None and ckpt.step == 2
