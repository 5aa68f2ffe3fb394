"""Hosts made of Linux namespaces: each has its own network stack, address and private disk.

Layout of one :class:`Hosts` (``net`` is its /24 inside 198.18.0.0/15, reserved for
benchmarking; nothing outside the namespaces made here is ever given such an address):

    root namespace (driver, Spark master)
      bridge <prefix>br  198.18.<net>.1/24
        veth <prefix>h<i> ── eth0 in namespace <prefix>-h<i>   198.18.<net>.<10+i>/24
    in each host namespace also:
      lo       up
      docker0  198.19.0.1/24, up: the same address on every host, as Docker's bridge is, and
               reaches no other host. Its name sorts before eth0, so code that takes "the first
               interface" picks it.

A process started with :meth:`Hosts.popen` runs in the host's network namespace and in a mount
namespace of its own where :data:`HOST_DISK` is a private tmpfs: a path that exists on every
host with different contents, as a local disk is on a real cluster. It also has the host's own
name (a UTS namespace: ``<prefix>-h<i>``), which resolves to the host's address through
``/etc/netns/<namespace>/hosts`` (``ip netns exec`` shows that file as ``/etc/hosts``), as a
host's name resolves through DNS on a real cluster.

Teardown kills every process inside each namespace (``ip netns pids``), deletes the
namespaces and the bridge, and :func:`leftovers` says whether anything is left.

Names and addresses are the machine's, so one prefix is one cluster at a time: :meth:`Hosts.start`
takes a lock on the prefix (``/run/lock``) for as long as the hosts live. A second test run on the
machine takes another prefix and /24 where it is offered several (:func:`claim_early`), or waits
for the first to finish with them (saying so); what a run killed before its teardown left under
the prefix (its lock went with it) is swept away before the hosts are made again.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HOST_DISK = Path("/tmp/sparktrain-host")
LOCKS = Path("/run/lock")
CLAIM_WAIT_S = 1800.0  # a whole cluster tier of another run, with room
DECOY_IF = "docker0"
DECOY_PEER = "dockerpeer"
DECOY_ADDR = "198.19.0.1/24"
HOST_IF = "eth0"
NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", "-n", netns, *args] if netns else ["ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Every network namespace ``ip netns`` knows."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def links() -> list[str]:
    """Every network interface of the root namespace."""
    return [line.split()[0].split("@")[0] for line in _ip("-br", "link").splitlines() if line]


def netns_pids(name: str) -> list[int]:
    """The processes running in network namespace ``name``."""
    out = _ip("netns", "pids", name, check=False)
    return [int(p) for p in out.split()]


def _is_host_name(prefix: str, name: str) -> bool:
    """Whether ``name`` is a host namespace of ``prefix`` (``<prefix>-h<i>``, also the name
    of its folder in /etc/netns), and no other prefix's."""
    return re.fullmatch(rf"{re.escape(prefix)}-h\d+", name) is not None


def _our_namespaces(prefix: str) -> list[str]:
    return [n for n in namespaces() if _is_host_name(prefix, n)]


def _our_links(prefix: str) -> list[str]:
    """The links of hosts named ``prefix`` (bridge ``<prefix>br``, veths ``<prefix>h<i>``):
    exactly these, since one prefix can begin another's names ("stclu" and "stclubr")."""
    return [n for n in links() if re.fullmatch(rf"{re.escape(prefix)}(br|h\d+)", n)]


def _our_etc(prefix: str) -> list[Path]:
    return [p for p in NETNS_ETC.glob(f"{prefix}-*") if _is_host_name(prefix, p.name)]


def leftovers(prefix: str) -> list[str]:
    """What of the hosts named ``prefix`` is still there: namespaces, links, processes."""
    ours = _our_namespaces(prefix)
    left = [f"netns {n}" for n in ours]
    left += [f"link {n}" for n in _our_links(prefix)]
    for ns in ours:
        left += [f"pid {p} in {ns}" for p in netns_pids(ns)]
    left += [f"file {p}" for p in _our_etc(prefix)]
    return left


def kill_namespace(name: str, within: float = 30.0) -> None:
    """SIGKILL every process in network namespace ``name`` and wait until none is left there.

    A process SIGKILLed has not yet ended: on a busy machine it can take a while to be
    scheduled and torn down, and until then it still runs in the namespace.

    Raises:
        RuntimeError: some are still there after ``within`` seconds.
    """
    deadline = time.monotonic() + within
    while pids := netns_pids(name):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {name} survive SIGKILL")
        time.sleep(0.1)


def sweep(prefix: str) -> None:
    """Remove what hosts named ``prefix`` left: their processes (waiting until they have
    ended), namespaces, links, files."""
    for ns in _our_namespaces(prefix):
        kill_namespace(ns)
        _ip("netns", "del", ns, check=False)
    for link in _our_links(prefix):
        _ip("link", "del", link, check=False)
    for etc in _our_etc(prefix):
        (etc / "hosts").unlink(missing_ok=True)
        try:
            etc.rmdir()
        except OSError:
            pass


# Prefixes this process locked ahead of time (claim_early), or why it could not.
_early: dict[str, int | RuntimeError] = {}
# The (prefix, net) claim_early chose.
_chosen: list[tuple[str, int]] = []


def claim_early(
    slots: Sequence[tuple[str, int]], wait_s: float = CLAIM_WAIT_S, say=print
) -> tuple[str, int]:
    """Lock one of ``slots`` (prefix, /24) now, before any test starts, for the
    :meth:`Hosts.start` that comes later; :func:`chosen_slot` then says which.

    The first slot no other run holds is taken at once, so test runs side by side on one
    machine each make their own hosts; when every slot is held, this waits for the first. That
    wait can be long, and it must not count against the time limit of the test that happens to
    make the hosts. If it fails, that :meth:`Hosts.start` (and every later one) raises the same
    error at once instead of waiting again.
    """
    if _chosen:
        return _chosen[0]
    for prefix, net in slots:
        try:
            _early[prefix] = claim(prefix, 0, say)
        except RuntimeError:
            continue
        _chosen.append((prefix, net))
        return prefix, net
    prefix, net = slots[0]
    try:
        _early[prefix] = claim(prefix, wait_s, say)
    except RuntimeError as exc:
        _early[prefix] = exc
    _chosen.append((prefix, net))
    return prefix, net


def chosen_slot(slots: Sequence[tuple[str, int]]) -> tuple[str, int]:
    """The slot :func:`claim_early` locked, else the first of ``slots`` (locked when used)."""
    return _chosen[0] if _chosen else slots[0]


def claim(prefix: str, wait_s: float = CLAIM_WAIT_S, say=print) -> int:
    """Lock ``prefix`` for this process (an open descriptor; closing it frees the prefix).

    Waits while another live run holds it, saying so every 30 s; raises ``RuntimeError`` naming
    the holder after ``wait_s``. Once held, whatever a dead run left under the prefix is swept.
    A lock :func:`claim_early` took is handed over instead (its failure raised again).
    """
    early = _early.get(prefix)
    if isinstance(early, RuntimeError):
        raise early
    if early is not None:
        del _early[prefix]
        return early
    LOCKS.mkdir(parents=True, exist_ok=True)
    path = LOCKS / f"sparktrain-hosts-{prefix}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    said = 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RuntimeError(
                    f"the namespace hosts {prefix!r} are still in use by process {holder} "
                    f"after {wait_s:.0f} s ({path}): wait for that test run to end, or stop it"
                ) from None
            if time.monotonic() - said >= 30:
                say(f"waiting for process {holder}, which uses the namespace hosts {prefix!r}")
                said = time.monotonic()
            time.sleep(0.5)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    sweep(prefix)
    return fd


@dataclasses.dataclass
class Host:
    """One host: its namespace, its address on the cluster's network, its interfaces."""

    name: str
    netns: str
    address: str


class Hosts:
    """Several hosts on one bridge, made on :meth:`start`, all gone after :meth:`close`.

    Args:
        prefix: names of the namespaces and links (at most 8 characters: link names are
            limited to 15).
        net: third byte of the cluster's /24 in 198.18.0.0/16.
        count: number of hosts.
    """

    def __init__(self, prefix: str, net: int, count: int) -> None:
        if len(prefix) > 8:
            raise ValueError(f"prefix {prefix!r} is longer than 8 characters")
        self.prefix = prefix
        self.bridge = f"{prefix}br"
        self.gateway = f"198.18.{net}.1"
        self.hosts = [
            Host(name=f"h{i}", netns=f"{prefix}-h{i}", address=f"198.18.{net}.{10 + i}")
            for i in range(1, count + 1)
        ]
        self._procs: list[subprocess.Popen[bytes]] = []
        self._claim: int | None = None

    def start(self) -> Hosts:
        """Make the bridge and the hosts (undone by :meth:`close` even when this fails)."""
        self._claim = claim(self.prefix)
        HOST_DISK.mkdir(exist_ok=True)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            outer = f"{self.prefix}{host.name}"
            _ip("netns", "add", host.netns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", HOST_IF, "netns", host.netns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", "lo", "up", netns=host.netns)
            _ip("addr", "add", f"{host.address}/24", "dev", HOST_IF, netns=host.netns)
            _ip("link", "set", HOST_IF, "up", netns=host.netns)
            # A veth pair with both ends in the host: up, with carrier, going nowhere.
            _ip(
                "link",
                "add",
                DECOY_IF,
                "type",
                "veth",
                "peer",
                "name",
                DECOY_PEER,
                netns=host.netns,
            )
            _ip("addr", "add", DECOY_ADDR, "dev", DECOY_IF, netns=host.netns)
            _ip("link", "set", DECOY_PEER, "up", netns=host.netns)
            _ip("link", "set", DECOY_IF, "up", netns=host.netns)
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.netns}\n")
        return self

    def popen(
        self,
        host: Host,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host``: its network namespace, and its own disk at HOST_DISK."""
        mount = (
            f"mount -t tmpfs -o size=64m {self.disk_name(host)} {HOST_DISK} && "
            f'hostname {host.netns} && exec "$@"'
        )
        cmd = [
            *("ip", "netns", "exec", host.netns),
            *("unshare", "--mount", "--uts", "--propagation", "private"),
            *("sh", "-c", mount, "sh", *argv),
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._procs.append(proc)
        return proc

    def disk_name(self, host: Host) -> str:
        """The source name of ``host``'s disk in the mount table (unique on the machine)."""
        return f"sparktrain-{self.prefix}-{host.name}"

    def kill_host(self, host: Host) -> None:
        """SIGKILL every process on ``host``, as when the machine dies, and wait for them."""
        kill_namespace(host.netns)

    def close(self) -> None:
        """Kill everything on every host, delete the namespaces and the bridge."""
        errors = []
        for host in self.hosts:
            if host.netns in namespaces():
                try:
                    self.kill_host(host)
                except RuntimeError as exc:
                    errors.append(str(exc))
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        present = links()
        for host in self.hosts:
            if f"{self.prefix}{host.name}" in present:
                _ip("link", "del", f"{self.prefix}{host.name}", check=False)
            if host.netns in namespaces():
                _ip("netns", "del", host.netns, check=False)
            (NETNS_ETC / host.netns / "hosts").unlink(missing_ok=True)
            for folder in (NETNS_ETC / host.netns, NETNS_ETC):
                try:
                    folder.rmdir()
                except OSError:
                    pass  # not there, or holds another namespace's files
        if self.bridge in links():
            _ip("link", "del", self.bridge, check=False)
        # veth ends die with their namespace; the bridge's ports go with the bridge. HOST_DISK
        # stays: it is empty here, and the mount point of other runs' hosts (removing it would
        # unmount their disks, and another run's host could find no mount point).
        # The kernel frees a deleted namespace's links in the background.
        deadline = time.monotonic() + 10
        while (left := leftovers(self.prefix)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._claim is not None:
            os.close(self._claim)  # the prefix is free for the next run
            self._claim = None
        if errors or left:
            raise RuntimeError(f"teardown left {left} ({'; '.join(errors)})")
