"""The cluster tier leaves nothing behind: no namespace, link, mount or JVM."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from tests.cluster.conftest import missing_requirement
from tests.cluster.hosts import HOST_DISK, leftovers
from tests.cluster.standalone import standalone_cluster

PREFIX = "stdown"
NET = 2  # apart from the tier's shared cluster, which may be up meanwhile

pytestmark = pytest.mark.cluster


def _holders_of_disk(source: str) -> list[int]:
    """Processes whose mount namespace has the host disk ``source`` mounted."""
    holders = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                if f" {source} " in f.read():
                    holders.append(pid)
        except OSError:
            continue
    return holders


def _jvms_of(master_url: str) -> list[int]:
    """Spark daemons and executors that belong to the cluster at ``master_url``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "java" in cmdline and master_url.split("//")[1] in cmdline:
            found.append(proc.pid)
    return found


def test_failed_test_leaves_no_namespace_link_mount_or_jvm():
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="a test failed here"):
        with standalone_cluster(PREFIX, NET, hosts=1, cores=1) as made:
            (host,) = made.hosts.hosts
            assert (
                f"{PREFIX}-h1"
                in subprocess.run(
                    ["ip", "netns", "list"], capture_output=True, text=True, check=True
                ).stdout
            )
            assert _jvms_of(made.master_url), "the master and the Worker run"
            # The host's disk: a tmpfs in the Worker's mount namespace, not in ours.
            assert _holders_of_disk(f"sparktrain-{host.name}")
            assert os.getpid() not in _holders_of_disk(f"sparktrain-{host.name}")
            master_url = made.master_url
            raise RuntimeError("a test failed here")
    assert leftovers(PREFIX) == []
    assert _jvms_of(master_url) == []
    assert _holders_of_disk(f"sparktrain-{host.name}") == []
    assert not HOST_DISK.exists() or not any(HOST_DISK.iterdir())
