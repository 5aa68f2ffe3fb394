"""Client and executors must agree where pickles cross: refused before any rank starts."""

from __future__ import annotations

import pytest

from sparktrain import ConfigurationError, SparkRunner
from sparktrain.driver import connect_check
from sparktrain.task.connect import versions

pytestmark = pytest.mark.spark


def touch(path: str) -> None:
    from pathlib import Path

    Path(path).touch()


def test_other_torch_on_the_executors_is_refused_before_training(connect, tmp_path, monkeypatch):
    # The client claims another torch than the executors really have (they report their own).
    client = versions() | {"torch": "1.0.0"}
    monkeypatch.setattr(connect_check, "versions", lambda: client)
    marker = tmp_path / "ran"
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=2, spark=connect).run(touch, str(marker))
    message = str(info.value)
    assert f"torch: client 1.0.0, executors {versions()['torch']}" in message
    assert "install the same versions on both sides" in message
    assert not marker.exists()


def test_matching_versions_pass_and_the_probe_runs_once_per_session(connect, monkeypatch):
    probes: list[list[dict[str, str]]] = []
    real = connect_check._probe

    def counted(*args, **kwargs):
        found = real(*args, **kwargs)
        probes.append(found)
        return found

    monkeypatch.setattr(connect_check, "_probe", counted)
    runner = SparkRunner(np=2, spark=connect)
    assert runner.run(lambda: 7) == 7
    assert runner.run(lambda: 8) == 8
    assert len(probes) == 1
    # One probe task per task of the stage, at once: each executor's Python worker (so a
    # process of its own) started and reached the client before the barrier stage.
    found = probes[0]
    assert [each["reached"] for each in found] == ["yes", "yes"]
    assert len({each["pid"] for each in found}) == 2
