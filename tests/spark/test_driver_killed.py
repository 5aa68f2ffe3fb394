"""SIGKILL the driver's Python mid-run: no rank, JVM or task folder outlives it for long.

What ends the ranks: on executors, the driver's JVM exits when its Python goes (its gateway
watches the pipe), the executors exit when their driver is gone, and each task's link to the
driver's channel breaks, which stops its ranks (SIGTERM, ``grace_period``, SIGKILL); a rank
also watches its parent. On the driver (np < 0) the ranks watch the driver process itself.
The folder a killed task could not remove is removed by the next task on that machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from sparktrain import SparkRunner, private_dir
from sparktrain.task import workdirs
from tests.fixtures import trainers
from tests.helpers import RANKS_START, alive, recorded_pids

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "driver_killed_job.py"
GRACE = 2.0
# Every rank is gone within this many seconds of the driver's death: the time to notice it
# (a closed connection or a dead parent: well under a second), plus the grace period, plus
# the SIGKILL that follows, plus slack for a loaded machine. Measured: about 2 s.
BOUND = GRACE + 13.0

pytestmark = pytest.mark.slow


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """Wait until ``pids`` have all exited, up to ``seconds``; those still alive."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


# Its own session's start (up to EXECUTORS_WAIT_S), the ranks' (RANKS_START), three BOUNDs
# and a last run: more than the suite's 300 s where the machine is busy.
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "np, how",
    [(2, "run"), (-2, "run"), (2, "submit")],
    ids=["executors", "driver", "submitted"],
)
def test_killing_the_driver_leaves_no_rank_behind(tmp_path: Path, np: int, how: str) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    tmp = tmp_path / "tmp"  # the driver's and its executors' temporary folder
    tmp.mkdir()
    tasks = tmp / f"{private_dir.PREFIX}{os.getuid()}" / workdirs.TASKS  # the tasks' own folders
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(pids_dir), str(np), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    jvm = 0
    ranks: list[int] = []
    zygotes: list[int] = []
    output: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if line.startswith("DRIVER "):
                jvm = int(line.split()[3])
                break
        # Keep reading the driver's output (a full pipe would block it), for the message below.
        threading.Thread(target=output.extend, args=(proc.stdout,), daemon=True).start()
        _wait_for_ranks(pids_dir, proc, output)
        ranks = recorded_pids(pids_dir)
        assert len(alive(ranks)) == 2
        assert list(tasks.glob("task-*")), f"the run's task folders were not in {tasks}"
        zygotes = _zygotes_with_tmpdir(tmp)
        assert zygotes, "no warm zygote was started after the first run's ranks"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _gone_within(ranks, BOUND) == [], f"ranks alive {BOUND:g}s after the driver died"
        # The warm zygotes the ranks were forked from go with their owners too.
        assert _gone_within(zygotes, BOUND) == [], "a zygote outlived the driver"
        if jvm:
            assert _gone_within([jvm], BOUND) == [], "the driver's JVM outlived its Python"
    finally:
        for pid in alive(ranks + zygotes):
            os.kill(pid, signal.SIGKILL)
        _kill_group(proc.pid)
        if proc.stdout is not None:
            proc.stdout.close()
    # The next run on this machine removes the folders the killed tasks left.
    import tempfile

    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp)
    try:
        assert SparkRunner(np=-1).run(trainers.noop) == 0
    finally:
        tempfile.tempdir = saved
    assert [p.name for p in tasks.iterdir()] == []


def _wait_for_ranks(pids_dir: Path, driver: subprocess.Popen[str], output: list[str]) -> None:
    """Wait for both ranks' pid files while the driver runs; fail with its output's tail if it
    exits first or they do not come within RANKS_START seconds."""
    deadline = time.monotonic() + RANKS_START
    while len(list(pids_dir.glob("*.pid"))) < 2:
        if driver.poll() is not None:
            raise AssertionError(
                f"the driver exited with {driver.returncode} before both ranks ran; "
                f"its output:\n{''.join(output[-40:])}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"only {sorted(pids_dir.glob('*.pid'))} of the ranks' pid files appeared "
                f"{RANKS_START:g} s after the driver's session was up; its output:\n"
                f"{''.join(output[-40:])}"
            )
        time.sleep(0.05)


def _zygotes_with_tmpdir(tmp: Path) -> list[int]:
    """The warm zygotes (sparktrain.worker.zygote) started by this test's driver or executors."""
    found = []
    for candidate in psutil.process_iter(["cmdline"]):
        try:
            if "sparktrain.worker.zygote" in (candidate.info.get("cmdline") or []):
                if candidate.environ().get("TMPDIR") == str(tmp):
                    found.append(candidate.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _kill_group(pgid: int) -> None:
    """Whatever the script started and left (a failing test must not leave JVMs running)."""
    for child in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(child.pid) == pgid:
                child.kill()
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
