"""sparktrain.checkpoint against real S3 calls: s3fs talking to moto's server on loopback."""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
s3fs = pytest.importorskip("s3fs", reason="s3fs is needed for the S3 checkpoint tests")
moto_server = pytest.importorskip(
    "moto.server", reason="moto[server] is needed for the S3 checkpoint tests"
)

from sparktrain import checkpoint  # noqa: E402
from sparktrain.checkpoint import CheckpointOwnershipError, CheckpointWarning  # noqa: E402


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh bucket; yields its checkpoint URL and the storage options to reach it."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "s3-run")
    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}}
    fs = s3fs.S3FileSystem(**options)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield f"s3://{bucket}/runs/one", options
    fs.rm(bucket, recursive=True)


def fs_of(options: dict[str, Any]) -> Any:
    fs = s3fs.S3FileSystem(**options)
    fs.invalidate_cache()
    return fs


def listing(url: str, options: dict[str, Any]) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in fs_of(options).ls(url, detail=False))


def state(step: int) -> dict[str, Any]:
    return {"step": step, "w": torch.full((1000,), float(step))}


def test_round_trip_and_keep_last(s3: tuple[str, dict[str, Any]]) -> None:
    url, options = s3
    assert checkpoint.load_latest(url, storage_options=options) is None
    paths = [
        checkpoint.save(state(step), url, step, keep_last=2, storage_options=options)
        for step in range(4)
    ]
    assert all(p is not None and p.startswith(url + "/step-") for p in paths)
    names = listing(url, options)
    assert names == sorted(
        [
            checkpoint.OWNER_FILE,
            "step-000000000002.commit.json",
            "step-000000000003.commit.json",
            paths[2].rsplit("/", 1)[-1],  # type: ignore[union-attr]
            paths[3].rsplit("/", 1)[-1],  # type: ignore[union-attr]
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt = checkpoint.load_latest(url, map_location="cpu", storage_options=options)
    assert ckpt is not None and ckpt.step == 3 and ckpt.path == paths[3]
    assert torch.equal(ckpt.state["w"], state(3)["w"])
    marker = json.loads(fs_of(options).cat_file(f"{url}/step-000000000003.commit.json"))
    assert marker["size"] == fs_of(options).size(paths[3])


def test_truncated_object_is_detected(s3: tuple[str, dict[str, Any]]) -> None:
    url, options = s3
    checkpoint.save(state(1), url, 1, storage_options=options)
    newest = checkpoint.save(state(2), url, 2, storage_options=options)
    fs = fs_of(options)
    fs.pipe_file(newest, fs.cat_file(newest)[:-100])
    with pytest.warns(CheckpointWarning, match="truncated") as record:
        ckpt = checkpoint.load_latest(url, storage_options=options)
    assert ckpt is not None and ckpt.step == 1
    assert any(f"{url}/step-000000000002.commit.json" in str(w.message) for w in record)


def test_corrupted_object_is_detected(s3: tuple[str, dict[str, Any]]) -> None:
    url, options = s3
    checkpoint.save(state(1), url, 1, storage_options=options)
    newest = checkpoint.save(state(2), url, 2, storage_options=options)
    fs = fs_of(options)
    raw = bytearray(fs.cat_file(newest))
    raw[-200] ^= 0x01
    fs.pipe_file(newest, bytes(raw))
    with pytest.warns(CheckpointWarning, match="corrupted"):
        ckpt = checkpoint.load_latest(url, storage_options=options)
    assert ckpt is not None and ckpt.step == 1


def test_object_without_marker_is_uncommitted(s3: tuple[str, dict[str, Any]]) -> None:
    url, options = s3
    checkpoint.save(state(1), url, 1, storage_options=options)
    newest = checkpoint.save(state(2), url, 2, storage_options=options)
    fs_of(options).rm_file(f"{url}/step-000000000002.commit.json")  # killed before its marker
    with pytest.warns(CheckpointWarning, match="no commit marker") as record:
        ckpt = checkpoint.load_latest(url, storage_options=options)
    assert ckpt is not None and ckpt.step == 1
    assert any(str(newest) in str(w.message) for w in record)
    checkpoint.save(state(3), url, 3, storage_options=options)
    assert not fs_of(options).exists(newest)  # the next save removes the leftover


def test_failed_upload_leaves_previous_intact(s3: tuple[str, dict[str, Any]]) -> None:
    url, options = s3
    checkpoint.save(state(1), url, 1, storage_options=options)
    before = listing(url, options)
    with pytest.raises(Exception, match="lambda|pickle"):
        checkpoint.save({"w": torch.ones(3), "f": lambda: 0}, url, 2, storage_options=options)
    assert listing(url, options) == before
    ckpt = checkpoint.load_latest(url, storage_options=options)
    assert ckpt is not None and ckpt.step == 1


def test_second_run_is_refused(
    s3: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = s3
    checkpoint.save(state(1), url, 1, storage_options=options)
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "other-run")
    with pytest.raises(CheckpointOwnershipError, match="'s3-run'.*'other-run'"):
        checkpoint.save(state(2), url, 2, storage_options=options)
    assert [n for n in listing(url, options) if n.endswith(".commit.json")] == [
        "step-000000000001.commit.json"
    ]
