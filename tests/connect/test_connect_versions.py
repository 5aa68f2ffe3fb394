"""Client and executors must agree where pickles cross: refused before any rank starts, by the
session's first stage itself (no job runs before it)."""

from __future__ import annotations

import pytest

from sparktrain import ConfigurationError, SparkRunner
from sparktrain.driver import attempts
from sparktrain.driver.launch import connect as connect_launch
from sparktrain.task.connect_stage import versions

pytestmark = pytest.mark.spark


def touch(path: str) -> None:
    from pathlib import Path

    Path(path).touch()


def test_other_torch_on_the_executors_is_refused_before_training(connect, tmp_path, monkeypatch):
    # The client claims another torch than the executors really have (they report their own).
    client = versions() | {"torch": "1.0.0"}
    monkeypatch.setattr(attempts, "versions", lambda: client)
    marker = tmp_path / "ran"
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=2, spark=connect).run(touch, str(marker))
    message = str(info.value)
    assert f"torch: client 1.0.0, executors {versions()['torch']}" in message
    assert "install the same versions on both sides" in message
    assert not marker.exists()


def test_matching_versions_pass_checked_by_the_first_stage_alone(connect, monkeypatch):
    from pyspark.sql.connect.dataframe import DataFrame

    launched: list[dict[str, str] | None] = []
    real_launch = connect_launch.ConnectLaunch.__init__

    def counted_launch(self, spark, job, description, frame=None):
        launched.append(job.client_versions)
        real_launch(self, spark, job, description, frame)

    mapped: list[bool] = []
    real_map = DataFrame.mapInArrow

    def counted_map(self, func, schema, barrier=False, *args, **kwargs):
        mapped.append(barrier)
        return real_map(self, func, schema, barrier, *args, **kwargs)

    monkeypatch.setattr(connect_launch.ConnectLaunch, "__init__", counted_launch)
    monkeypatch.setattr(DataFrame, "mapInArrow", counted_map)
    runner = SparkRunner(np=2, spark=connect)
    assert runner.run(lambda: 7) == 7
    assert runner.run(lambda: 8) == 8
    # One stage per run and no other Python job; the first stage's tasks checked the versions
    # (and that they reach the client), the second's did not.
    assert mapped == [True, True]
    assert launched == [versions(), None]
