"""The folders a task keeps its own files in (payload, outcome files), and their cleanup.

Each folder lives in the user's private folder (``<private>/tasks``, see
:mod:`sparktrain.private_dir`), so no other account can read a payload or plant an outcome file.

A task removes its folder when it ends. A task that cannot (its Python worker killed with
SIGKILL, as when the driver dies and its executors go with it) leaves it behind, so every new
one first removes the folders whose owner is gone. "Gone" is decided by a lock, not a pid: the
owner holds ``fcntl.flock`` on a file inside its folder for as long as the folder is in use, and
the kernel releases it however the owner dies. A pid means nothing across pid namespaces
(containers that share ``/tmp`` and a uid see each other's files, not each other's processes);
a lock on the same file is the same lock from every namespace. The lock's descriptor is not
inherited (``O_CLOEXEC``; ranks and zygotes start through exec with ``close_fds``), so a rank
that outlives its task does not keep the task's folder alive.

The sweep can never stop or harm a run: it looks at each entry's type and owner (``lstat``)
before its name, parses nothing but a bounded name pattern, reads at most ``_MAX_ENTRIES``
entries, and leaves alone anything it cannot judge, logging it once per sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sparktrain import private_dir
from sparktrain.log import get_logger
from sparktrain.shipping import kept

_log = get_logger(__name__)

TASKS = "tasks"
LOCK_FILE = ".owner.lock"
_STAGING = ".new-"
_NAME = re.compile(r"^(?:\.new-)?task-[A-Za-z0-9_-]{1,80}$")
_MAX_ENTRIES = 10_000
_LOCK_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextlib.contextmanager
def create(run_id: str, parent: str | None = None, kept_ttl: float | None = None) -> Iterator[Path]:
    """A fresh folder for one task of ``run_id``, locked by this process while in use.

    The folder is made and locked under a name the sweep does not take for a finished folder,
    then renamed: no sweep ever sees it unlocked. It is removed when the block ends. Where
    another account holds the private folder's name, the folder goes to a fallback folder of
    this user's (see :func:`sparktrain.private_dir.usable_root`), with a warning naming it.

    Args:
        run_id: the run's id, part of the folder's name (to tell folders apart by eye).
        parent: where to make the private folder instead of the temporary folder.
        kept_ttl: also remove this user's kept results older than this many seconds on this
            host (see :func:`sparktrain.shipping.kept.sweep`); None leaves them.

    Raises:
        NotPrivateError: no private folder can be had in the temporary folder at all.
    """
    base = private_dir.usable_folder(TASKS, parent)
    sweep(base)
    kept.sweep(kept_ttl, parent)
    prefix = f"{_STAGING}task-{_safe(run_id)}-{os.getpid()}-"  # the pid only for people
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    fd = -1
    try:
        fd = os.open(staging / LOCK_FILE, private_dir.EXCLUSIVE, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = base / staging.name[len(_STAGING) :]
        os.rename(staging, path)
        staging = path
        yield path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


# A folder still under its staging name is being made (mkdtemp, lock file, lock, rename take
# microseconds): another task's sweep leaves it alone for this long, so it never takes one
# between its lock file's creation and its lock for a dead task's leftover.
STAGING_GRACE = 60.0


def _safe(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", run_id)[:40]


def sweep(base: Path) -> list[Path]:
    """Remove the task folders in ``base`` whose owner no longer holds their lock.

    Never raises: whatever cannot be judged is left alone.

    Returns:
        The folders removed.
    """
    removed: list[Path] = []
    left: list[str] = []
    try:
        with os.scandir(base) as entries:
            for count, entry in enumerate(entries):
                if count >= _MAX_ENTRIES:
                    left.append(f"more than {_MAX_ENTRIES} entries in {base}")
                    break
                why = _sweep_one(entry)
                if why is None:
                    removed.append(Path(entry.path))
                elif why:
                    left.append(f"{entry.path}: {why}")
    except OSError as exc:
        left.append(f"{base}: {exc}")
    if removed:
        _log.info("removed %d task folder(s) left by processes that are gone", len(removed))
    if left:
        # One line per sweep however many entries: a sweep runs once per task.
        _log.info(
            "left %d entr%s alone in the task folders, e.g. %s",
            len(left),
            "y" if len(left) == 1 else "ies",
            left[0],
        )
    return removed


def _sweep_one(entry: os.DirEntry[str]) -> str | None:
    """Remove one dead task folder: None if removed, "" if live or not ours to judge, else why
    it was left alone."""
    try:
        info = entry.stat(follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return "not a folder of this user's"
        if _NAME.match(entry.name) is None:
            return ""
        if entry.name.startswith(_STAGING) and time.time() - info.st_mtime < STAGING_GRACE:
            return ""  # being made right now, by a task beside this one
        # O_NONBLOCK: a FIFO in its place must not hang the sweep (checked just below).
        fd = os.open(os.path.join(entry.path, LOCK_FILE), _LOCK_READ)
    except FileNotFoundError:
        return "no lock file"  # being made or being removed; or not a task folder
    except OSError as exc:
        return str(exc)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "its lock is not a file"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ""  # its owner is alive, in whatever pid namespace
        except OSError as exc:
            return str(exc)
        failed: list[str] = []
        shutil.rmtree(entry.path, onerror=lambda _f, path, exc: failed.append(f"{path}: {exc[1]}"))
        return failed[0] if failed else None
    finally:
        os.close(fd)
