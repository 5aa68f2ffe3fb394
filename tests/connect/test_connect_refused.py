"""What a Spark Connect session refuses, before any job starts, with the way out."""

from __future__ import annotations

import pytest

from sparktrain import ConfigurationError, SparkRunner

pytestmark = pytest.mark.spark


def touch(path: str) -> None:
    from pathlib import Path

    Path(path).touch()


def test_an_elastic_np_is_refused_with_the_fixed_np_to_use(connect, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=(1, 2), spark=connect).run(touch, str(marker))
    message = str(info.value)
    assert "np=(1, 2) is elastic, which needs the cluster's free task slots" in message
    assert "a Spark Connect client cannot count them" in message
    assert "run with a fixed np (e.g. np=2) under Spark Connect" in message
    assert not marker.exists()
