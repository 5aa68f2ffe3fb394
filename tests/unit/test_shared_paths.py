"""A directory declared shared is checked: rank 0's marker must be seen from every host.

Each "host" here is a folder of its own standing for the same path on two machines: a rank
of another host looks in its folder, where rank 0's marker appears only if the path is shared.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparktrain import checkpoint, contract
from sparktrain.data import SparkDatasetConverter
from sparktrain.errors import ConfigurationError
from sparktrain.worker import shared_paths


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, node: int, run: str = "run1") -> None:
    """This process is ``rank`` of 4, two per host, on host ``node``."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("NODE_RANK", str(node))
    monkeypatch.setenv(contract.RUN_ID_ENV, run)
    monkeypatch.setenv(contract.ATTEMPT_ENV, "0")
    monkeypatch.setenv(contract.HOST_ENV, f"198.18.1.{11 + node}")
    monkeypatch.setenv(contract.RANK0_HOST_ENV, "198.18.1.11")
    monkeypatch.setenv(contract.START_TIMEOUT_ENV, "1")


@pytest.fixture(autouse=True)
def _fresh_checks():
    """Checks are remembered per process; each test starts without any."""
    shared_paths._verify.cache_clear()
    yield
    shared_paths._verify.cache_clear()


def test_a_path_that_is_not_shared_names_both_hosts(monkeypatch, tmp_path):
    host1, host2 = tmp_path / "h1", tmp_path / "h2"
    _as_rank(monkeypatch, 0, 0)
    checkpoint.load_latest(host1, shared=True)  # rank 0 writes its marker on its host
    _as_rank(monkeypatch, 2, 1)
    with pytest.raises(ConfigurationError) as info:
        checkpoint.load_latest(host2, shared=True)
    message = str(info.value)
    assert f"checkpoint directory '{host2}' was declared shared" in message
    assert "rank 0 writes there on 198.18.1.11" in message
    assert "did not appear on 198.18.1.12 within 1s (start_timeout)" in message


def test_a_shared_path_passes_once_rank_0_has_written_its_marker(monkeypatch, tmp_path):
    _as_rank(monkeypatch, 2, 1)
    seen: list[BaseException | None] = []

    def other_host() -> None:
        try:
            checkpoint.load_latest(tmp_path, shared=True)
            seen.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            seen.append(exc)

    monkeypatch.setenv(contract.START_TIMEOUT_ENV, "30")
    waiter = threading.Thread(target=other_host)
    waiter.start()  # waits for rank 0's marker
    marker_dir = tmp_path / shared_paths.MARKER_DIR
    shared_paths._write_marker(marker_dir, marker_dir / "run1-0", "198.18.1.11")
    waiter.join(timeout=30)
    assert not waiter.is_alive() and seen == [None]
    assert (marker_dir / "run1-0").read_text() == "198.18.1.11"


def test_rank_0s_host_and_a_second_call_do_not_wait(monkeypatch, tmp_path):
    _as_rank(monkeypatch, 1, 0)  # rank 0's host: same disk, nothing to check
    assert checkpoint.load_latest(tmp_path, shared=True) is None
    assert not (tmp_path / shared_paths.MARKER_DIR).exists()


def test_rank_0_removes_stale_markers_of_other_runs_only(monkeypatch, tmp_path):
    import os
    import time

    folder = tmp_path / shared_paths.MARKER_DIR
    folder.mkdir()
    stale, fresh = folder / "old-0", folder / "recent-0"
    stale.write_text("x")
    fresh.write_text("x")
    old = time.time() - shared_paths.STALE_MARKER - 60
    os.utime(stale, (old, old))
    _as_rank(monkeypatch, 0, 0)
    checkpoint.save({"w": 1}, tmp_path, step=0, shared=True)
    assert sorted(p.name for p in folder.iterdir()) == ["recent-0", "run1-0"]
    # The marker folder is not taken for a checkpoint.
    assert checkpoint.load_latest(tmp_path, shared=True).step == 0  # type: ignore[union-attr]


def _converter(folder: Path, shared: bool) -> SparkDatasetConverter:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0, 4.0]}), folder / "part-0.parquet")
    return SparkDatasetConverter.from_parquet(str(folder), shared=shared)


def test_a_local_converter_cache_is_refused_on_two_hosts(monkeypatch, tmp_path):
    converter = _converter(tmp_path / "cache", shared=False)
    _as_rank(monkeypatch, 2, 1)
    with pytest.raises(ConfigurationError) as info:
        converter.make_torch_dataloader(2)
    message = str(info.value)
    assert f"data cache directory 'file://{tmp_path}/cache' is a local path" in message
    assert "2 of 4 ranks on this one" in message
    assert "make_spark_converter(df, shared=True)" in message


def test_a_converter_cache_declared_shared_is_checked(monkeypatch, tmp_path):
    converter = _converter(tmp_path / "h1", shared=True)
    other = _converter(tmp_path / "h2", shared=True)  # the same path, on another host
    _as_rank(monkeypatch, 0, 0)
    with converter.make_torch_dataloader(2, num_epochs=1) as loader:
        assert sum(len(b["x"]) for b in loader) == 1  # rank 0's shard: 4 rows, 4 ranks
    _as_rank(monkeypatch, 2, 1)
    with pytest.raises(ConfigurationError, match="data cache directory .* was declared shared"):
        other.make_torch_dataloader(2)
    # Once it is shared (rank 0's marker seen), the rank loads its shard.
    with converter.make_torch_dataloader(2, num_epochs=1) as loader:
        assert sum(len(b["x"]) for b in loader) == 1


def test_one_host_or_a_url_is_never_checked(monkeypatch, tmp_path):
    verified = []
    monkeypatch.setattr(shared_paths, "verify_shared", lambda *args: verified.append(args))
    _as_rank(monkeypatch, 2, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # every rank on one host
    for shared in (False, True):
        shared_paths.check_shared("x", "p", str(tmp_path), shared, "fix")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for shared in (False, True):
        shared_paths.check_shared("x", "s3://b/p", None, shared, "fix")
    # Not refused, not verified (no marker waited for), nothing written.
    assert verified == []
    assert list(tmp_path.iterdir()) == []
    # The same path declared shared on ranks that span hosts is verified: the spy works.
    shared_paths.check_shared("x", "p", str(tmp_path), True, "fix")
    assert verified == [("x", "p", str(tmp_path))]
