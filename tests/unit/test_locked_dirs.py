"""The per-process folders of sparktrain.locked_dirs (task folders, stream folders, spills): a
folder whose owner lives is never swept, a SIGKILLed owner's is, a lock that is not a regular
file of this user's is never trusted, a folder being made is taken only with its lock, and a
base folder fuller than the bound is swept in bounded steps. Real processes, real locks."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparktrain import locked_dirs, private_dir
from sparktrain.log import get_logger
from tests.accounts import CHECKOUT

PREFIX = "thing-"
_LOG = get_logger("sparktrain.tests.locked_dirs")


def _base(tmp_path: Path) -> Path:
    return private_dir.folder("things", tmp_path)


def _dead(base: Path, label: str = "") -> Path:
    """A folder whose owner let go of its lock without removing it (as if it died)."""
    path, fd = locked_dirs.make_locked(base, PREFIX, label)
    os.close(fd)
    return path


def _owner(code: str) -> tuple[subprocess.Popen[str], Path]:
    """A live process running ``code`` (which prints its folder, then waits on stdin)."""
    owner = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    return owner, Path(owner.stdout.readline().strip())


def _holding(base: Path) -> tuple[subprocess.Popen[str], Path]:
    """A live process holding a folder made by make_locked, as a task or a rank does."""
    return _owner(
        "import sys\n"
        "from pathlib import Path\n"
        "from sparktrain import locked_dirs\n"
        f"path, fd = locked_dirs.make_locked(Path({str(base)!r}), {PREFIX!r}, 'live-')\n"
        "print(path, flush=True)\n"
        "sys.stdin.read()\n"
    )


def test_a_live_owners_folder_is_never_swept_and_a_killed_ones_is(tmp_path: Path) -> None:
    base = _base(tmp_path)
    owner, path = _holding(base)
    try:
        (path / "data").write_bytes(b"the live owner's")
        assert path.name.startswith(f"{PREFIX}live-") and (path / locked_dirs.LOCK_FILE).is_file()
        assert locked_dirs.sweep(base, PREFIX) == []
        assert locked_dirs.sweep(base, PREFIX) == []  # however often it is swept
        assert (path / "data").read_bytes() == b"the live owner's"
        owner.kill()  # SIGKILL: it cannot clean up; the kernel drops its lock
        assert owner.wait() == -9
        assert path.is_dir()  # nothing removes it but a sweep
        assert locked_dirs.sweep(base, PREFIX) == [path]
        assert list(base.iterdir()) == []
    finally:
        owner.kill()
        owner.wait()


def test_a_folder_being_made_goes_only_with_its_lock(tmp_path: Path) -> None:
    """A staging folder past the grace period is removed only once its lock can be taken:
    one whose maker holds its lock (however old it looks) stays."""
    base = _base(tmp_path)
    old = time.time() - locked_dirs.STAGING_GRACE - 1
    owner, held = _owner(
        "import fcntl, os, sys\n"
        "from pathlib import Path\n"
        f"path = Path({str(base)!r}) / '.new-{PREFIX}held'\n"
        "path.mkdir(mode=0o700)\n"
        f"fd = os.open(path / {locked_dirs.LOCK_FILE!r}, os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        f"os.utime(path, ({old}, {old}))\n"
        "print(path, flush=True)\n"
        "sys.stdin.read()\n"
    )
    free = base / f".new-{PREFIX}free"
    free.mkdir(mode=0o700)
    (free / locked_dirs.LOCK_FILE).touch(mode=0o600)
    os.utime(free, (old, old))
    try:
        assert locked_dirs.sweep(base, PREFIX) == [free]
        assert held.is_dir() and (held / locked_dirs.LOCK_FILE).is_file()
        owner.kill()
        owner.wait()
        assert locked_dirs.sweep(base, PREFIX) == [held]
    finally:
        owner.kill()
        owner.wait()


def test_a_lock_that_is_a_link_or_a_fifo_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = _base(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("someone's file")
    target = precious / "lock"
    target.write_text("")  # a free lock, had the link been followed
    linked = base / f"{PREFIX}linked"
    linked.mkdir(mode=0o700)
    (linked / locked_dirs.LOCK_FILE).symlink_to(target)
    fifo = base / f"{PREFIX}fifo"
    fifo.mkdir(mode=0o700)
    os.mkfifo(fifo / locked_dirs.LOCK_FILE)  # opening it must not hang the sweep
    caplog.set_level(logging.INFO, logger="sparktrain")

    assert locked_dirs.sweep(base, PREFIX, "things", _LOG) == []

    assert sorted(p.name for p in base.iterdir()) == [f"{PREFIX}fifo", f"{PREFIX}linked"]
    assert (linked / locked_dirs.LOCK_FILE).is_symlink() and (precious / "keep").exists()
    lines = [r.getMessage() for r in caplog.records if r.name == "sparktrain.tests.locked_dirs"]
    assert len(lines) == 1 and lines[0].startswith("left 2 entries alone in the things, e.g. ")


def test_a_lock_file_of_another_account_is_not_trusted(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another account needs root")
    base = _base(tmp_path)
    planted = _dead(base, "planted-")
    os.chown(planted / locked_dirs.LOCK_FILE, 65534, 65534)
    mine = _dead(base, "mine-")
    assert locked_dirs.sweep(base, PREFIX) == [mine]
    assert planted.is_dir()


def test_more_entries_than_the_bound_are_swept_a_bound_at_a_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = _base(tmp_path)
    dead = {_dead(base) for _ in range(12)}
    caplog.set_level(logging.INFO, logger="sparktrain")

    first = locked_dirs.sweep(base, PREFIX, "things", _LOG, limit=5)

    assert len(first) == 5 and set(first) <= dead  # five looked at, not twelve
    assert len(list(base.iterdir())) == 7
    lines = [r.getMessage() for r in caplog.records if r.name == "sparktrain.tests.locked_dirs"]
    assert lines[-1] == f"left 1 entry alone in the things, e.g. more than 5 entries in {base}"
    second = locked_dirs.sweep(base, PREFIX, limit=5)
    third = locked_dirs.sweep(base, PREFIX, limit=5)
    assert (len(second), len(third)) == (5, 2)
    assert set(first + second + third) == dead and list(base.iterdir()) == []


def test_only_names_of_the_kind_swept_are_taken(tmp_path: Path) -> None:
    base = _base(tmp_path)
    other_kind, fd = locked_dirs.make_locked(base, "other-")
    os.close(fd)  # dead too, but of another kind
    mine = _dead(base)
    (base / f"{PREFIX}{'9' * 200}").mkdir()  # longer than any name made here
    (base / f"{PREFIX}file").write_text("not a folder")
    assert locked_dirs.sweep(base, PREFIX) == [mine]
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [other_kind.name, f"{PREFIX}{'9' * 200}", f"{PREFIX}file"]
    )


def test_a_name_the_sweep_could_never_take_is_refused(tmp_path: Path) -> None:
    base = _base(tmp_path)
    with pytest.raises(ValueError, match="letters, digits, '_' and '-' only"):
        locked_dirs.make_locked(base, "feed.")
    with pytest.raises(ValueError, match="letters, digits, '_' and '-' only"):
        locked_dirs.make_locked(base, PREFIX, "run/1")
    assert list(base.iterdir()) == []  # nothing made
    path, fd = locked_dirs.make_locked(base, PREFIX, "run_1-")
    try:
        assert path.name.startswith(f"{PREFIX}run_1-{os.getpid()}-")
        assert locked_dirs.sweep(base, PREFIX) == []  # its own lock, held
    finally:
        os.close(fd)
