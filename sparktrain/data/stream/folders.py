"""Folders of this package that live as long as the process that made them, and their sweep.

Each folder (``<prefix>XXXXXXXX`` in a private folder, see :mod:`sparktrain.private_dir`)
holds a lock file that its owner keeps ``flock``-ed for its whole life. It is made and locked
under a staging name that the sweep does not take (``.new-<prefix>...``), then renamed, so no
sweep ever sees it unlocked. A process that died without removing its folder (SIGKILL, OOM)
leaves a folder whose lock anyone can take: :func:`sweep` removes exactly those. A lock, not a
pid, tells the living from the dead, so pid namespaces and reused pids cannot fool it; and the
sweep never fails its caller.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from sparktrain import private_dir
from sparktrain.log import get_logger

_log = get_logger(__name__)

LOCK_FILE = ".owner.lock"
STAGING = ".new-"
# A folder still under its staging name is being made (microseconds); left alone this long.
STAGING_GRACE = 60.0
_LOCK_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def make_locked(base: Path, prefix: str) -> tuple[Path, int]:
    """A new folder ``base/<prefix>...`` (0700), locked by this process.

    Returns:
        The folder and the lock's file descriptor (close it after removing the folder).
    """
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{prefix}{os.getpid()}-", dir=base))
    fd = -1
    try:
        fd = os.open(staging / LOCK_FILE, private_dir.EXCLUSIVE, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = base / staging.name[len(STAGING) :]
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if fd >= 0:
            os.close(fd)
        raise
    return path, fd


def sweep(base: Path, prefix: str) -> list[Path]:
    """Remove the folders ``base/<prefix>...`` whose owner is gone; never raises.

    Returns:
        The folders removed.
    """
    removed: list[Path] = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return removed
    for name in names:
        path = base / name
        try:
            if _dead(path, name, prefix):
                shutil.rmtree(path)
                removed.append(path)
        except OSError as exc:
            _log.debug("left %s: %s", path, exc)
    if removed:
        _log.info("removed %d folder(s) of ended processes in %s", len(removed), base)
    return removed


def _dead(path: Path, name: str, prefix: str) -> bool:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    if name.startswith(STAGING + prefix):
        return time.time() - info.st_mtime > STAGING_GRACE
    if not name.startswith(prefix):
        return False
    fd = os.open(path / LOCK_FILE, _LOCK_READ)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its owner holds it: alive
    finally:
        os.close(fd)
    return True
