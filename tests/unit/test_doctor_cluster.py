"""``sparktrain doctor`` on a cluster, without one: how hosts' reports read (no Spark)."""

from __future__ import annotations

import platform
from typing import Any

import pytest

from sparktrain.commands import cli, doctor_host
from sparktrain.commands.doctor_cluster import checkpoint_check, host_checks, version_mismatches
from sparktrain.commands.doctor_probes import FAIL, OK, WARN

DRIVER = {"python": "3.11.7", "torch": "2.13.0+cpu", "cloudpickle": "3.1.2", "sparktrain": "0.1.0"}


def report(index: int, host: str, port: int, **changes: Any) -> dict[str, Any]:
    """One task's report, as doctor_host.probe makes it."""
    row: dict[str, Any] = {
        "index": index,
        "host": host,
        "executor": f"{host}:{port}",
        "versions": dict(DRIVER),
        "gpus": [str(index % 2)],
        "interfaces": {"docker0": ["198.19.0.1"], "eth0": [host], "veth9": []},
        "chosen": "eth0",
        "write_error": None,
        "read_error": None,
    }
    row.update(changes)
    return row


def test_python_must_agree_on_minor_version_packages_exactly():
    assert version_mismatches(DRIVER, {**DRIVER, "python": "3.11.2"}) == []
    assert version_mismatches(DRIVER, {**DRIVER, "python": "3.10.12"}) == [
        "python 3.10.12 (driver 3.11.7)"
    ]
    assert version_mismatches(DRIVER, {**DRIVER, "cloudpickle": "2.2.1", "sparktrain": None}) == [
        "cloudpickle 2.2.1 (driver 3.1.2)",
        "sparktrain not installed (driver 0.1.0)",
    ]
    # What the driver lacks is not compared.
    assert version_mismatches({**DRIVER, "torch": None}, {**DRIVER, "torch": "2.1.0"}) == []


def test_a_host_with_another_python_is_an_error_that_names_the_fix():
    reports = [
        report(0, "10.0.0.1", 4001),
        report(1, "10.0.0.1", 4002),
        report(2, "10.0.0.2", 4003, versions={**DRIVER, "python": "3.10.12"}),
    ]
    rows = {row.name: row for row in host_checks(reports, DRIVER)}
    good, bad = rows["host 10.0.0.1"], rows["host 10.0.0.2"]
    assert good.status == OK and good.detail.startswith("2 executor(s); python 3.11.7")
    assert bad.status == FAIL and bad.essential
    assert bad.detail.endswith("differs: python 3.10.12 (driver 3.11.7)")
    assert "spark.pyspark.python" in bad.fix and "Python minor version" in bad.fix
    assert rows["host 10.0.0.1 gpus"].detail == "10.0.0.1:4001: 0; 10.0.0.1:4002: 1"
    network = rows["host 10.0.0.2 network"]
    assert network.detail == "docker0 198.19.0.1, eth0 10.0.0.2; sparktrain uses eth0"


def test_an_executor_address_no_interface_holds_is_a_warning():
    rows = host_checks([report(0, "node-7", 4001, chosen=None)], DRIVER)
    network = next(r for r in rows if r.name == "host node-7 network")
    assert network.status == WARN and network.detail.endswith("uses none")
    assert "SPARK_LOCAL_IP" in network.fix and "GLOO_SOCKET_IFNAME" in network.fix


def test_checkpoint_written_on_one_host_and_missing_on_another_is_not_shared():
    url = "/mnt/local/ckpt"
    reports = [
        report(0, "10.0.0.1", 4001),
        report(1, "10.0.0.2", 4002, read_error="not found here"),
    ]
    row = checkpoint_check(url, reports)
    assert row.status == FAIL
    assert row.detail == (
        f"{url}: written from 10.0.0.1, but not readable on 10.0.0.2 (not found here)"
    )
    assert "s3://" in row.fix and "start from scratch" in row.fix
    shared = checkpoint_check("s3://b/run", [report(0, "10.0.0.1", 1), report(1, "10.0.0.2", 2)])
    assert shared.status == OK
    assert shared.detail == "s3://b/run: written from 10.0.0.1, read back on 10.0.0.2"
    denied = checkpoint_check("s3://b/run", [report(0, "10.0.0.1", 1, write_error="Denied")])
    assert denied.status == FAIL and "cannot write from 10.0.0.1: Denied" in denied.detail


def test_host_probe_round_trip_on_a_local_folder(tmp_path):
    """The executor side, here: it writes, reads back and removes its probe file."""

    class Context:
        def partitionId(self) -> int:  # noqa: N802 - BarrierTaskContext's name
            return 0

        def getTaskInfos(self) -> list[Any]:  # noqa: N802
            return [type("Info", (), {"address": "127.0.0.1:4001"})()]

        def resources(self) -> dict[str, Any]:
            return {}

        def barrier(self) -> None:
            assert list(tmp_path.iterdir()), "the probe file is there at the first barrier"

    found = doctor_host.probe(Context(), str(tmp_path), "t0k3n")
    assert found["write_error"] is None and found["read_error"] is None
    assert found["versions"]["python"] == platform.python_version()
    assert found["host"] == "127.0.0.1" and found["executor"] == "127.0.0.1:4001"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv", [["doctor", "--checkpoint", "s3://b"], ["doctor", "--conf", "a=b"]]
)
def test_checkpoint_and_conf_need_a_master(argv, capsys):
    assert cli.main(argv) == 2
    assert "need --master" in capsys.readouterr().err
