"""The folders a task keeps its own files in (payload, outcome files), and their cleanup.

A task removes its folder when it ends. A task that cannot (its Python worker killed with
SIGKILL, as when the driver dies and its executors go with it) leaves it behind: so each
folder's name carries the pid of the process that owns it, and every new one first removes
the folders of owners that are gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from sparktrain.log import get_logger

_log = get_logger(__name__)

_NAME = re.compile(r"^sparktrain-[0-9a-f]{6,64}-(\d+)-[A-Za-z0-9_]+$")


def create(run_id: str) -> Path:
    """A fresh folder for one task of ``run_id``, owned by this process."""
    sweep()
    return Path(tempfile.mkdtemp(prefix=f"sparktrain-{run_id}-{os.getpid()}-"))


def sweep(parent: str | None = None) -> list[Path]:
    """Remove the task folders in ``parent`` (the temporary folder) whose owner is gone.

    Returns:
        The folders removed.
    """
    removed: list[Path] = []
    root = Path(parent or tempfile.gettempdir())
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        found = _NAME.match(entry.name)
        if found is None or _alive(int(found.group(1))):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    if removed:
        _log.info("removed %d task folder(s) left by processes that are gone", len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
