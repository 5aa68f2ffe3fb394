"""A local checkpoint directory is refused when the ranks run on several hosts."""

from __future__ import annotations

import pytest

from sparktrain import checkpoint
from sparktrain.errors import ConfigurationError


@pytest.fixture
def two_hosts(monkeypatch):
    """This process is rank 2 of 4, two ranks per host."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")


def test_local_path_on_two_hosts_is_refused_by_save_and_load(two_hosts, tmp_path):
    for call in (
        lambda: checkpoint.save({"w": 1}, tmp_path, step=0),
        lambda: checkpoint.load_latest(tmp_path),
        lambda: checkpoint.save({"w": 1}, f"file://{tmp_path}", step=0),
    ):
        with pytest.raises(ConfigurationError) as info:
            call()
        message = str(info.value)
        assert "is a local path, but this run's ranks are on more than one host" in message
        assert "2 of 4 ranks on this one" in message
        assert "s3://" in message and "shared=True" in message


def test_shared_true_on_rank_0s_host_is_the_same_disk(two_hosts, monkeypatch, tmp_path):
    monkeypatch.setenv("NODE_RANK", "0")  # checked across hosts: see test_shared_paths.py
    assert checkpoint.save({"w": 1}, tmp_path, step=0, shared=True) is None  # rank 2
    assert checkpoint.load_latest(tmp_path, shared=True) is None


def test_one_host_and_outside_a_run_accept_a_local_path(monkeypatch, tmp_path):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert checkpoint.save({"w": 1}, tmp_path, step=0) is not None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert checkpoint.load_latest(tmp_path).state == {"w": 1}


def test_a_url_is_accepted_on_two_hosts(two_hosts):
    pytest.importorskip("fsspec")
    assert checkpoint.load_latest("memory://sparktrain-shared-check/run") is None
