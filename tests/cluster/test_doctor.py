"""``sparktrain doctor`` on the two-host cluster: one row per host, the interface sparktrain
uses, and whether a checkpoint location is shared by every host."""

from __future__ import annotations

import io
import platform

import pytest

from sparktrain.commands import doctor
from tests.cluster.hosts import DECOY_ADDR, DECOY_IF, HOST_DISK, HOST_IF

pytestmark = pytest.mark.cluster


def _rows(text: str) -> dict[str, str]:
    """The table's rows by check name (the name and the detail after the status mark)."""
    rows = {}
    for line in text.splitlines():
        for name in ("checkpoint", "cluster", "host "):
            head = line[5:]  # "  ✓ " + padding: the name starts at column 5
            if head.startswith(name):
                key, _, detail = head.partition("  ")
                rows[key.strip()] = line[:4].strip() + " " + detail.strip()
    return rows


def test_doctor_reports_each_host_and_a_shared_checkpoint(cluster, cluster_spark, cluster_s3):
    bucket = cluster_s3.new_bucket("doctor")
    url = f"s3://{bucket}/ckpt"
    out = io.StringIO()
    # The executors reach the S3 endpoint as ranks do: through the environment they are given.
    code = doctor.main(session=cluster_spark, checkpoint=url, stream=out, env=cluster_s3.env)
    text = out.getvalue()
    rows = _rows(text)
    assert code == 0, text
    assert rows["cluster"] == f"✓ {cluster.master_url}: 4 executor(s) on 2 host(s)", text
    python = platform.python_version()
    decoy = DECOY_ADDR.split("/")[0]
    for host in cluster.hosts.hosts:
        name = f"host {host.address}"
        assert rows[name].startswith(f"✓ 2 executor(s); python {python}, torch "), text
        assert ", cloudpickle " in rows[name] and ", sparktrain " in rows[name]
        # Each executor of the host has its own fake GPU.
        gpus = sorted(part.rsplit(": ", 1)[1] for part in rows[f"{name} gpus"][2:].split("; "))
        assert gpus == ["0", "1"], text
        assert rows[f"{name} network"] == (
            f"✓ {DECOY_IF} {decoy}, {HOST_IF} {host.address}; sparktrain uses {HOST_IF}"
        ), text
    first, second = (h.address for h in cluster.hosts.hosts)
    assert rows["checkpoint"] in (
        f"✓ {url}: written from {first}, read back on {second}",
        f"✓ {url}: written from {second}, read back on {first}",
    ), text
    assert cluster_s3.fs().ls(bucket, detail=False) == [], "the probe file is removed"


def test_doctor_finds_a_host_local_checkpoint_dir_is_not_shared(cluster, cluster_spark):
    out = io.StringIO()
    local = f"{HOST_DISK}/ckpt"
    doctor.main(session=cluster_spark, checkpoint=local, stream=out)
    text = out.getvalue()
    row = _rows(text)["checkpoint"]
    first, second = (h.address for h in cluster.hosts.hosts)
    # Written on one host's disk; the other host's executors do not find it.
    assert row in (
        f"✗ {local}: written from {first}, but not readable on {second} (not found here)",
        f"✗ {local}: written from {second}, but not readable on {first} (not found here)",
    ), text
    assert "fix: use a URL every host reaches (s3://…" in text
