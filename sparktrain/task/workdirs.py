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

The folders are made, locked and swept by :mod:`sparktrain.locked_dirs`, whose sweep can never
stop or harm a run: it looks at each entry's type and owner (``lstat``) before its name, parses
nothing but a bounded name pattern, trusts a lock only as a regular file of this user's, reads
at most ``locked_dirs.MAX_ENTRIES`` entries, removes a folder only while holding its lock, and
leaves alone anything it cannot judge, logging it once per sweep.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from sparktrain import locked_dirs, private_dir
from sparktrain.log import get_logger
from sparktrain.shipping import kept

_log = get_logger(__name__)

TASKS = "tasks"
LOCK_FILE = locked_dirs.LOCK_FILE
_PREFIX = "task-"
# A folder still under its staging name is being made: a sweep leaves it alone this long.
STAGING_GRACE = locked_dirs.STAGING_GRACE


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
    # The run id and pid in the name are only for people.
    path, fd = locked_dirs.make_locked(base, _PREFIX, f"{_safe(run_id)}-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def _safe(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", run_id)[:40]


def sweep(base: Path) -> list[Path]:
    """Remove the task folders in ``base`` whose owner no longer holds their lock.

    Never raises: whatever cannot be judged is left alone (see
    :func:`sparktrain.locked_dirs.sweep`).

    Returns:
        The folders removed.
    """
    return locked_dirs.sweep(base, _PREFIX, "task folders", _log)
