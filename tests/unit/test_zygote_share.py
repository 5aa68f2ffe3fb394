"""An executor's warm zygote outlives the Python worker that started it: the executor's later
workers fork their ranks from it, and it ends with the executor's Python daemon.

Each test runs a small daemon (``tests/fixtures/scripts/zygote_daemon.py``) that forks its
workers one after another, as pyspark's daemon does; each worker runs one real rank.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sparktrain import private_dir
from sparktrain.shipping.payload import dump_call
from sparktrain.task import zygote_share, zygotes
from tests.accounts import Account, need_python
from tests.unit.test_supervise import ROOT, wait_gone
from tests.unit.test_zygotes import cell

DAEMON = ROOT / "tests" / "fixtures" / "scripts" / "zygote_daemon.py"


class Daemon:
    """The daemon script, its workers' lines, and what it left."""

    def __init__(self, tmp: Path, workers: int, *extra: str) -> None:
        workdir = tmp / "work"
        workdir.mkdir(exist_ok=True)
        payload = workdir / "payload.pkl"
        payload.write_bytes(dump_call(cell("place"), (), {}, 1 << 20))
        paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TMPDIR": str(tmp)}
        self.proc = subprocess.Popen(
            [sys.executable, str(DAEMON), str(payload), str(workdir), str(workers), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(workdir),
        )
        self.workers: list[list[str]] = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("DAEMON "):
                break
            if line.startswith("WORKER "):
                self.workers.append(line.split()[1:])
        self.folder = tmp / f"{private_dir.PREFIX}{os.getuid()}" / zygote_share.SHARE_FOLDER

    def zygotes(self) -> set[int]:
        return {int(w[2]) for w in self.workers}

    def end(self) -> None:
        """The executor ends: its daemon's stdin closes."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.zygotes():
            if pid and not wait_gone(pid, 0.1):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for daemon in made:
        daemon.close()


def test_later_workers_fork_from_the_zygote_the_first_started(tmp_path, daemons):
    daemon = Daemon(tmp_path, 3, "kill")  # each worker ends by SIGKILL once its rank ended
    daemons.append(daemon)
    assert len(daemon.workers) == 3, daemon.workers
    pids = [int(w[1]) for w in daemon.workers]
    assert len(set(pids)) == 3  # three workers, one after another
    # The first started the zygote (and waited for it to load); the others joined that one.
    assert [w[3] for w in daemon.workers] == ["False", "True", "True"]
    assert len(daemon.zygotes()) == 1 and 0 not in daemon.zygotes()
    assert [w[4:] for w in daemon.workers] == [["True", "[0]"]] * 3  # forked, and exit code 0
    (zygote,) = daemon.zygotes()
    assert psutil.Process(zygote).is_running()  # the workers that started it were killed
    names = [p.name for p in daemon.folder.iterdir()]
    assert names == [f"{daemon.proc.pid}-{n.partition('-')[2]}" for n in names] and len(names) == 1
    daemon.end()
    # It ends with the daemon (its pidfd says so), and takes its name with it.
    assert wait_gone(zygote, 10.0), "the zygote outlived the executor's daemon"
    assert list(daemon.folder.iterdir()) == []


def test_a_zygote_no_worker_came_back_to_ends_with_its_name(tmp_path, daemons):
    daemon = Daemon(tmp_path, 1, "unowned=1")  # its only worker ended; the executor lives on
    daemons.append(daemon)
    (zygote,) = daemon.zygotes()
    assert wait_gone(zygote, 15.0), "a zygote without owners outlived its unowned time"
    assert list(daemon.folder.iterdir()) == []
    assert daemon.proc.poll() is None


def test_a_zygote_killed_outright_is_replaced_and_its_name_forgotten(tmp_path, daemons):
    first = Daemon(tmp_path, 1)
    daemons.append(first)
    (zygote,) = first.zygotes()
    os.kill(zygote, signal.SIGKILL)  # its socket's name stays behind
    assert wait_gone(zygote, 5.0)
    (left,) = list(first.folder.iterdir())
    second = Daemon(tmp_path, 2)  # the same executor's next workers
    daemons.append(second)
    assert [w[3:] for w in second.workers] == [
        ["False", "True", "[0]"],  # nothing answered at the name: a new zygote
        ["True", "True", "[0]"],
    ]
    assert second.zygotes() != {zygote}
    first.end()
    # The next zygote's worker forgets the names of those whose daemon has ended.
    third = Daemon(tmp_path, 1)
    daemons.append(third)
    assert not left.exists()
    assert sorted(p.name.partition("-")[0] for p in first.folder.iterdir()) == sorted(
        [str(second.proc.pid), str(third.proc.pid)]
    )


def test_a_socket_name_longer_than_unix_allows_is_still_shared(tmp_path, daemons):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    daemon = Daemon(deep, 2)
    daemons.append(daemon)
    (name,) = list(daemon.folder.iterdir())
    assert len(os.fsencode(str(name))) > 108
    assert [w[3:] for w in daemon.workers] == [["False", "True", "[0]"], ["True", "True", "[0]"]]
    assert len(daemon.zygotes()) == 1


def test_another_account_cannot_reach_the_zygote(tmp: Path, other: Account, daemons):
    need_python(other)
    daemon = Daemon(tmp, 1)
    daemons.append(daemon)
    (name,) = list(daemon.folder.iterdir())
    probe = other.python(
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n"
        f"    s.connect({str(name)!r})\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
        "else:\n"
        "    print('connected')\n"
    )
    assert probe.stdout.strip() == "PermissionError", probe
    (zygote,) = daemon.zygotes()
    assert psutil.Process(zygote).is_running()


def test_without_pidfds_the_zygote_serves_its_worker_alone(tmp_path, monkeypatch):
    def no_pidfds(pid: int) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    zygote = zygotes.zygote_for(env, str(workdir), wait=120, shared=True)
    try:
        assert zygote is not None and zygote.usable()  # warm starts still work
        assert zygote.info is not None and zygote.info["shared"] is False
        folder = tmp_path / f"{private_dir.PREFIX}{os.getuid()}" / zygote_share.SHARE_FOLDER
        assert list(folder.iterdir()) == []  # nothing another worker could join
    finally:
        if zygote is not None:
            with zygotes._zygotes_lock:
                zygotes._zygotes.pop(zygote.key, None)
            zygote.close()
            assert zygote.proc is not None and zygote.proc.wait(15) == 0
