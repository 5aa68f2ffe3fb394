"""The cluster tier leaves nothing behind: no namespace, link, mount or JVM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.cluster.conftest import missing_requirement
from tests.cluster.hosts import HOST_DISK, Hosts, claim, leftovers, netns_pids
from tests.cluster.standalone import standalone_cluster
from tests.helpers import wait_for

PREFIX = "stdown"
NET = 2  # apart from the tier's shared cluster, which may be up meanwhile
ROOT = Path(__file__).resolve().parents[2]

# Another test run on this machine: makes hosts, starts a process on one, says "up", then holds
# them until its stdin closes (or it is killed, with no teardown at all).
OTHER_RUN = """
import sys
from pathlib import Path
from tests.cluster.hosts import Hosts
hosts = Hosts(sys.argv[1], int(sys.argv[2]), 1).start()
hosts.popen(hosts.hosts[0], ["sleep", "600"], {"PATH": "/usr/bin:/bin"}, Path(sys.argv[3]))
print("up", flush=True)
sys.stdin.read()
hosts.close()
"""


def _other_run(prefix: str, net: int, tmp_path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OTHER_RUN, prefix, str(net), str(tmp_path / "sleep.log")],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


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
            assert _holders_of_disk(made.hosts.disk_name(host))
            assert os.getpid() not in _holders_of_disk(made.hosts.disk_name(host))
            master_url = made.master_url
            raise RuntimeError("a test failed here")
    assert leftovers(PREFIX) == []
    assert _jvms_of(master_url) == []
    assert _holders_of_disk(made.hosts.disk_name(host)) == []
    assert not HOST_DISK.exists() or not any(HOST_DISK.iterdir())


def test_what_a_killed_run_left_does_not_stop_the_next_run(tmp_path):
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    other = _other_run(PREFIX, NET, tmp_path)
    os.kill(other.pid, signal.SIGKILL)  # no teardown: its bridge, namespace and process stay
    other.wait(timeout=30)
    left = leftovers(PREFIX)
    assert f"link {PREFIX}br" in left and f"netns {PREFIX}-h1" in left
    (orphan,) = netns_pids(f"{PREFIX}-h1")
    hosts = Hosts(PREFIX, NET, 1)
    try:
        hosts.start()
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
        assert netns_pids(f"{PREFIX}-h1") == []
    finally:
        hosts.close()
    assert leftovers(PREFIX) == []


def test_a_second_run_waits_for_the_hosts_in_use_and_says_whose_they_are(tmp_path):
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    other = _other_run(PREFIX, NET, tmp_path)
    try:
        with pytest.raises(RuntimeError, match=f"in use by process {other.pid} after 0 s"):
            claim(PREFIX, wait_s=0)
        said: list[str] = []

        def say(message: str) -> None:
            said.append(message)
            assert other.stdin is not None
            other.stdin.close()  # the other run ends and tears its hosts down

        fd = claim(PREFIX, wait_s=120, say=say)
        os.close(fd)
        assert said == [f"waiting for process {other.pid}, which uses the namespace hosts 'stdown'"]
        assert other.wait(timeout=30) == 0
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(timeout=30)
            Hosts(PREFIX, NET, 1).close()
    assert leftovers(PREFIX) == []


# A fresh process, as a test run is: claim_early keeps its choice for the process.
CHOOSE = """
from tests.cluster.hosts import chosen_slot, claim_early
print(claim_early([("stdown", 2), ("stdownb", 5)], wait_s=0, say=print))
print(chosen_slot([("stdown", 2)]))
"""


@contextlib.contextmanager
def _beside_another_run(prefix: str, net: int, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another test run holding hosts named ``prefix``, a process on its host; it must still
    run at the end of the block, then end cleanly, leaving nothing of them or of "stdownb"."""
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    other = _other_run(prefix, net, tmp_path)
    try:
        yield other
        assert other.poll() is None
    finally:
        assert other.stdin is not None
        other.stdin.close()
        assert other.wait(timeout=30) == 0
    assert leftovers(prefix) == [] and leftovers(PREFIX) == [] and leftovers("stdownb") == []


def test_a_second_run_makes_its_hosts_in_the_next_free_slot_at_once(tmp_path):
    with _beside_another_run(PREFIX, NET, tmp_path):
        chose = subprocess.run(
            [sys.executable, "-c", CHOOSE], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        # Not a wait for the other run's hosts (its wait_s=0 would have failed), nor a word.
        assert chose.stdout.splitlines() == ["('stdownb', 5)", "('stdownb', 5)"], chose.stderr


def test_another_runs_teardown_leaves_this_runs_host_disks_mounted(tmp_path):
    # The host disks of every run share one mount point: a teardown that removed it (empty as
    # the machine sees it) would unmount the disks of the hosts other runs still use.
    with _beside_another_run(PREFIX, NET, tmp_path):  # a process on its host, its disk mounted
        hosts = Hosts(PREFIX, NET, 1)
        disk = hosts.disk_name(hosts.hosts[0])
        # Its process mounts the disk as it starts, after the other run has said "up".
        wait_for(lambda: _holders_of_disk(disk), 30, "the other run's host disk mounted")
        Hosts("stdownb", 6, 1).start().close()
        assert _holders_of_disk(disk), "the other run's host lost its disk"
        assert HOST_DISK.is_dir()


def test_sweeping_a_prefix_leaves_the_hosts_of_a_prefix_it_begins(tmp_path):
    # "stdown" begins "stdownb"'s link names (stdownbbr, stdownbh1): claiming "stdown", which
    # sweeps what a dead run left under it, must not take the live hosts of "stdownb".
    def names() -> list[str]:  # its namespace, links and files (its processes come and go:
        # the host's disk is mounted by a short-lived child as its process starts)
        return sorted(thing for thing in leftovers("stdownb") if not thing.startswith("pid "))

    with _beside_another_run("stdownb", 5, tmp_path):
        before = names()
        assert "link stdownbbr" in before and "netns stdownb-h1" in before
        os.close(claim(PREFIX, wait_s=0))
        assert names() == before
