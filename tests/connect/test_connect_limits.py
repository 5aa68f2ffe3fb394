"""What a Spark Connect session cannot carry or see: a payload over gRPC's message limit, and
the cluster's free task slots."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.driver.connect_check import check_slots
from sparktrain.errors import CapacityError, PayloadError

pytestmark = pytest.mark.spark


def _writes_marker(where: str, blob: bytes) -> int:
    Path(where, "ran").write_text(str(len(blob)))
    return len(blob)


def test_payload_over_the_grpc_limit_is_refused_before_the_stage(connect, tmp_path):
    blob = b"x" * (150 << 20)  # captured by the function's arguments: 150 MiB to pickle
    with pytest.raises(PayloadError) as info:
        SparkRunner(np=2, spark=connect).run(_writes_marker, str(tmp_path), blob)
    message = str(info.value)
    assert "take 150.0 MiB" in message and "at most 128.0 MiB" in message
    assert "as a path" in message and "spark.connect.grpc.maxInboundMessageSize" in message
    assert not (tmp_path / "ran").exists()  # no rank ran
    # The session is still usable, and a payload that fits runs.
    small = SparkRunner(np=2, spark=connect).run(_writes_marker, str(tmp_path), b"y" * 1000)
    assert small == 1000 and (tmp_path / "ran").read_text() == "1000"


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


def test_slots_the_client_cannot_see_are_said_before_the_stage(caplog):
    caplog.set_level(logging.WARNING, logger="sparktrain")
    check_slots(_Session({"spark.master": "local-cluster[2,1,1024]"}), 2)
    said = caplog.text
    assert "the run needs 2 task slots at once; the session's conf gives 2 in all" in said
    assert "cannot see how many are free" in said and "barrier stage waits" in said
    caplog.clear()
    check_slots(_Session({"spark.master": "spark://somewhere:7077"}), 3)
    assert "the session's conf does not say how many the cluster has" in caplog.text


def test_slots_the_conf_rules_out_are_refused():
    with pytest.raises(CapacityError, match="needs 3 task slots at once, but the session's conf"):
        check_slots(_Session({"spark.master": "local-cluster[2,1,1024]"}), 3)
