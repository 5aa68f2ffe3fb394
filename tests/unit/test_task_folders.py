"""Task folders being made are never swept as a dead task's leftovers (two tasks of one host
start at once: one's sweep must not take the other's folder between its lock file and its
lock, which failed a restarted run with FileNotFoundError on the folder's rename)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sparktrain import private_dir
from sparktrain.task import workdirs


def _half_made(base: Path, name: str) -> Path:
    """A folder as its maker has it right after creating its lock file, before locking it."""
    staging = base / f".new-task-{name}"
    staging.mkdir(mode=0o700)
    (staging / workdirs.LOCK_FILE).touch(mode=0o600)
    return staging


def test_a_folder_being_made_is_left_alone_and_a_stale_one_is_removed(tmp_path: Path) -> None:
    base = private_dir.folder(workdirs.TASKS, tmp_path)
    fresh = _half_made(base, "fresh")
    stale = _half_made(base, "stale")
    old = time.time() - workdirs.STAGING_GRACE - 1
    os.utime(stale, (old, old))  # its maker died between mkdtemp and rename long ago
    assert workdirs.sweep(base) == [stale]
    assert fresh.is_dir() and (fresh / workdirs.LOCK_FILE).exists()


def test_tasks_starting_together_all_get_their_folders(tmp_path: Path) -> None:
    """Many tasks of one host make their folders at once, each sweeping first."""
    made: list[Path] = []
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def task(i: int) -> None:
        try:
            start.wait()
            with workdirs.create(f"run{i}", str(tmp_path)) as path:
                assert path.is_dir() and (path / workdirs.LOCK_FILE).exists()
                made.append(path)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and len(made) == 16
    assert (
        list(private_dir.folder(workdirs.TASKS, tmp_path).iterdir()) == []
    )  # each removed its own
