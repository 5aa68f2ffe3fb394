"""Runs on a host shared with other accounts and containers: nothing planted in the temporary
folder stops a run, a task in another pid namespace never deletes a live task's folder, a
rank that outlives its task does not keep the folder forever, and a real local run keeps its
files in the user's private folder. Real processes, real accounts (through runuser)."""

from __future__ import annotations

import os
import pickle
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

import sparktrain
from sparktrain import SparkRunner, WorkerFailedError, private_dir
from sparktrain.task import workdirs
from tests.accounts import CHECKOUT, Account, need_root
from tests.fixtures import host_files
from tests.helpers import wait_gone

OVERFLOW = "sparktrain-abcdef-99999999999999999999-x"


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(CHECKOUT)}


def test_folders_planted_in_the_temporary_folder_stop_no_run(tmp: Path, other: Account) -> None:
    # Another account's folder with an overflowing pid; the same uid (another container)
    # leaves odd things among the task folders: a name too big for a pid, a file, a link to a
    # folder of the victim's that looks like a dead task's.
    other.run("mkdir", str(tmp / OVERFLOW))
    tasks = private_dir.folder(workdirs.TASKS)
    (tasks / "task-abcdef-99999999999999999999-x").mkdir()
    (tasks / "task-file").write_text("not a folder")
    precious = tmp / "precious"
    precious.mkdir()
    (precious / workdirs.LOCK_FILE).write_text("")
    (tasks / "task-link").symlink_to(precious)
    (tasks / ("task-" + "9" * 4000)[:255]).mkdir()
    (tasks / "task-fifo").mkdir()
    os.mkfifo(tasks / "task-fifo" / workdirs.LOCK_FILE)  # opening it must not hang the sweep

    result = SparkRunner(np=-2).run(host_files.own_folder)

    assert Path(result["own_folder"]).parent == tasks
    assert not Path(result["own_folder"]).exists()  # its own folder is gone with the run
    assert sorted(p.name for p in tasks.iterdir()) == sorted(
        [
            "task-abcdef-99999999999999999999-x",
            "task-file",
            "task-link",
            "task-fifo",
            ("task-" + "9" * 4000)[:255],
        ]
    )
    assert (precious / workdirs.LOCK_FILE).exists() and (tmp / OVERFLOW).is_dir()


def _owner(tmp: Path, with_child: bool) -> tuple[subprocess.Popen[str], Path, int]:
    """A process holding a task folder (and, like a task, a child it started): its folder."""
    code = (
        "import subprocess, sys\n"
        "from sparktrain.task import workdirs\n"
        "with workdirs.create('abc123') as path:\n"
        f"    child = subprocess.Popen(['sleep', '600']) if {with_child} else None\n"
        "    print(path, child.pid if child else 0, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code],
        env=_env(tmp),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    path, child = owner.stdout.readline().split()
    return owner, Path(path), int(child)


def _sweep_in_a_new_pid_namespace(tmp: Path, owner_pid: int) -> list[str]:
    """Sweep as a process in its own pid namespace (another container sharing /tmp and uid)."""
    code = (
        "import os\n"
        "from sparktrain import private_dir\n"
        "from sparktrain.task import workdirs\n"
        "try:\n"
        f"    os.kill({owner_pid}, 0)\n"
        "    print('owner visible')\n"
        "except ProcessLookupError:\n"
        "    print('owner invisible')\n"
        "print(*workdirs.sweep(private_dir.folder(workdirs.TASKS)))\n"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code],
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen, removed = done.stdout.split("\n")[:2]
    assert seen == "owner invisible"  # what kill(pid, 0) would have called "gone"
    return removed.split()


def test_a_sweep_from_another_pid_namespace_leaves_a_live_task_folder_alone(tmp: Path) -> None:
    need_root()
    owner, path, _ = _owner(tmp, with_child=False)
    try:
        (path / "payload.pkl").write_bytes(b"the live task's payload")
        assert _sweep_in_a_new_pid_namespace(tmp, owner.pid) == []
        assert (path / "payload.pkl").read_bytes() == b"the live task's payload"
        owner.kill()  # SIGKILL: it cannot clean up; the kernel drops its lock
        owner.wait()
        assert _sweep_in_a_new_pid_namespace(tmp, owner.pid) == [str(path)]
        assert not path.exists()
    finally:
        owner.kill()
        owner.wait()


def test_a_rank_that_outlives_its_task_does_not_keep_the_folder(tmp: Path) -> None:
    owner, path, child = _owner(tmp, with_child=True)
    try:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert psutil.pid_exists(child)  # the child lives on, and holds no lock
        assert workdirs.sweep(private_dir.folder(workdirs.TASKS)) == [path]
    finally:
        owner.kill()
        owner.wait()
        os.kill(child, signal.SIGKILL)
        wait_gone([child])


def test_a_local_run_keeps_its_files_in_the_real_private_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real default location, end to end: no TMPDIR, the system's temporary folder.
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    home = Path(tempfile.gettempdir()) / f"sparktrain-{os.getuid()}"
    runner = SparkRunner(np=-2, max_result_bytes=1 << 10)
    assert Path(runner.run(host_files.own_folder)["own_folder"]).parent == home / "tasks"
    info = os.lstat(home)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700

    with pytest.raises(WorkerFailedError) as error:
        runner.run(host_files.own_folder, 4 << 10)  # over max_result_bytes: kept
    message = str(error.value)
    kept = Path(message.split("it is kept in ")[1].split(" ")[0])
    try:
        assert kept.parent == home / "results"
        assert "sparktrain.load_kept(path) reads it back" in message
        assert sparktrain.load_kept(kept)["blob"] == b"x" * (4 << 10)
        assert pickle.loads(kept.read_bytes())["blob"] == b"x" * (4 << 10)
    finally:
        kept.unlink()


def test_the_sweep_leaves_what_it_cannot_judge_and_says_so_once(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = private_dir.folder(workdirs.TASKS)
    for name in ("task-a", "task-b", "task-c"):
        (tasks / name).mkdir()
    os.mkfifo(tasks / "task-a" / workdirs.LOCK_FILE)
    (tasks / "task-b" / workdirs.LOCK_FILE).symlink_to(tmp)
    caplog.set_level("INFO", logger="sparktrain")
    assert workdirs.sweep(tasks) == []
    lines = [r.getMessage() for r in caplog.records if r.name == workdirs.__name__]
    assert len(lines) == 1 and lines[0].startswith("left 3 entries alone in the task folders")
    assert sorted(p.name for p in tasks.iterdir()) == ["task-a", "task-b", "task-c"]
