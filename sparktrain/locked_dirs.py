"""Folders that live as long as the process that made them, and the sweep of dead ones.

A folder ``<base>/<prefix><label><pid>-XXXXXXXX`` (``base`` a folder of the user's private
folder, see :mod:`sparktrain.private_dir`) holds a lock file that its owner keeps ``flock``-ed
for as long as the folder is in use. It is made and locked under a staging name
(``.new-<prefix>...``), then renamed, so no sweep ever sees it finished and unlocked. A process
that ends without removing its folder (SIGKILL, OOM, a driver whose executors go with it)
leaves a folder whose lock anyone can take: :func:`sweep` removes exactly those, while holding
that lock.

"Gone" is decided by the lock, not a pid: a pid means nothing across pid namespaces
(containers that share ``/tmp`` and a uid see each other's files, not each other's processes)
and pids are reused; a lock on the same file is the same lock from every namespace, and the
kernel releases it however its owner dies. The lock's descriptor is not inherited
(``O_CLOEXEC``), so a child that outlives its owner does not keep the folder alive.

The sweep can never stop or harm its caller: it looks at each entry's type and owner (``lstat``)
before its name, takes only names of a bounded pattern, opens a lock file without following a
link or blocking on a FIFO and trusts it only as a regular file of this user's, reads at most
:data:`MAX_ENTRIES` entries, removes a folder only while holding its lock, and leaves alone
anything it cannot judge, logging it once per sweep.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
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
# A folder still under its staging name is being made (mkdtemp, lock file, lock, rename take
# microseconds): a sweep leaves it alone for this long, so it never takes one between its lock
# file's creation and its lock. After that, it goes only if its lock can be taken.
STAGING_GRACE = 60.0
# Entries of a base folder one sweep looks at, at the most.
MAX_ENTRIES = 10_000

_PART = re.compile(r"^[A-Za-z0-9_-]*$")
_LOCK_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def make_locked(base: Path, prefix: str, label: str = "") -> tuple[Path, int]:
    """A new folder ``base/<prefix><label><pid>-XXXXXXXX`` (0700), locked by this process.

    Args:
        base: a folder of this user's alone (see :func:`sparktrain.private_dir.usable_folder`).
        prefix: the kind of folder, the name :func:`sweep` is given (letters, digits, ``_``,
            ``-``).
        label: more of the name, to tell folders apart by eye (the same characters).

    Returns:
        The folder and the lock's file descriptor: remove the folder, then close it.

    Raises:
        ValueError: ``prefix`` or ``label`` has other characters (its folders would never be
            swept).
        OSError: the folder could not be made; nothing is left behind.
    """
    if not prefix or not _PART.match(prefix) or not _PART.match(label):
        raise ValueError(
            f"a locked folder's prefix and label take letters, digits, '_' and '-' only "
            f"(and the prefix at least one), not {prefix!r} and {label!r}"
        )
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{prefix}{label}{os.getpid()}-", dir=base))
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


def sweep(
    base: Path,
    prefix: str,
    what: str = "folders",
    log: logging.LoggerAdapter[logging.Logger] | None = None,
    limit: int = MAX_ENTRIES,
) -> list[Path]:
    """Remove the folders ``base/<prefix>...`` whose owner no longer holds their lock.

    Never raises: whatever cannot be judged is left alone, and said once in ``log``.

    Args:
        base: the folder to sweep.
        prefix: the kind of folder to sweep (as given to :func:`make_locked`).
        what: how the log names these folders ("task folders").
        log: the caller's logger (default this module's).
        limit: the most entries of ``base`` to look at.

    Returns:
        The folders removed.
    """
    log = log if log is not None else _log
    name = re.compile(rf"^(?:{re.escape(STAGING)})?{re.escape(prefix)}[A-Za-z0-9_-]{{1,80}}$")
    removed: list[Path] = []
    left: list[str] = []
    try:
        with os.scandir(base) as entries:
            for count, entry in enumerate(entries):
                if count >= limit:
                    left.append(f"more than {limit} entries in {base}")
                    break
                why = _sweep_one(entry, name)
                if why is None:
                    removed.append(Path(entry.path))
                elif why:
                    left.append(f"{entry.path}: {why}")
    except OSError as exc:
        left.append(f"{base}: {exc}")
    if removed:
        log.info("removed %d %s left by processes that are gone", len(removed), what)
    if left:
        # One line per sweep however many entries: a sweep runs once per folder made.
        log.info(
            "left %d entr%s alone in the %s, e.g. %s",
            len(left),
            "y" if len(left) == 1 else "ies",
            what,
            left[0],
        )
    return removed


def _sweep_one(entry: os.DirEntry[str], name: re.Pattern[str]) -> str | None:
    """Remove one dead owner's folder: None if removed, "" if live or not ours to judge, else
    why it was left alone."""
    try:
        info = entry.stat(follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return "not a folder of this user's"
        if name.match(entry.name) is None:
            return ""
        if entry.name.startswith(STAGING) and time.time() - info.st_mtime < STAGING_GRACE:
            return ""  # being made right now, by a process beside this one
        # O_NONBLOCK: a FIFO in its place must not hang the sweep (checked just below).
        fd = os.open(os.path.join(entry.path, LOCK_FILE), _LOCK_READ)
    except FileNotFoundError:
        return "no lock file"  # being made or being removed; or not such a folder
    except OSError as exc:
        return str(exc)
    try:
        lock = os.fstat(fd)
        if not stat.S_ISREG(lock.st_mode) or lock.st_uid != os.getuid():
            return "its lock is not a file of this user's"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ""  # its owner is alive, in whatever pid namespace
        except OSError as exc:
            return str(exc)
        if not _still_there(entry.path, lock):
            return ""  # another sweep took it first
        failed: list[str] = []
        shutil.rmtree(entry.path, onerror=lambda _f, path, exc: failed.append(f"{path}: {exc[1]}"))
        return failed[0] if failed else None
    finally:
        os.close(fd)


def _still_there(folder: str, lock: os.stat_result) -> bool:
    """Whether the lock file taken is still the one in ``folder`` (not removed, with its
    folder, by a sweep that took it between this one's open and lock)."""
    try:
        now = os.lstat(os.path.join(folder, LOCK_FILE))
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (lock.st_dev, lock.st_ino)
