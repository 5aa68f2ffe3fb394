"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


def wait_for(
    condition: Callable[[], object],
    timeout: float = 30.0,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> None:
    """Wait until ``condition()`` is true; fail naming ``what`` after ``timeout`` seconds,
    with what ``explain()`` says of the state then (where given)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            state = f"; {explain()}" if explain is not None else ""
            raise AssertionError(f"{what or condition} did not happen within {timeout}s{state}")
        time.sleep(0.02)


def settled_tracker(spark: Any) -> Any:
    """Spark's status tracker once Spark has told it every event posted so far.

    The tracker learns of a job's end from Spark's listener bus, a queue handled on a thread of
    its own: a run whose job ended (its ``collect()`` returned) can still be listed as active
    for a moment on a busy machine. Waiting for the queue to be empty is not waiting for jobs:
    a job still running is still listed.
    """
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
    return spark.sparkContext.statusTracker()


# Seconds from a run's submit to its ranks running, on a busy machine: the run's own bound
# on its rendezvous (start_timeout, 120 s by default), then cold Python workers and their
# imports (under a minute quiet; more than 120 s in all beside two other suites).
RANKS_START = 240.0


def wait_for_files(
    directory: Path, pattern: str, count: int, timeout: float = 60.0, handle: Any = None
) -> list[Path]:
    """Wait until ``count`` files match; the files are written atomically by the ranks.

    With ``handle`` (the run's :class:`RunHandle`), a run that ends first fails the wait at
    once, and a failure shows the run's status and its ranks' last lines.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(directory.glob(pattern))
        if len(found) >= count:
            return found
        if handle is not None and handle.done():
            break
        time.sleep(0.05)
    found = sorted(directory.glob(pattern))
    if len(found) >= count:
        return found
    text = f"only {found} appeared in {timeout}s"
    if handle is not None:
        ended = handle.exception() if handle.done() and not handle.cancelled() else None
        text += f"; the run: {handle.status()}" + (f" ({ended!r})" if ended else "")
        text += "\n" + "\n".join(handle.tail(40))
    raise AssertionError(text)


def interrupt_once_started(
    directory: Path,
    pattern: str = "*.pid",
    count: int = 2,
    timeout: float = 240.0,
    signum: int = signal.SIGINT,
) -> threading.Thread:
    """Press Ctrl-C (SIGINT to this process; or send ``signum``) once ``count`` files match in
    ``directory``: the ranks have started. After ``timeout`` it presses anyway, so the run
    under test ends whatever happened and the test's own checks (the files are there) say what
    was missing, instead of the run blocking until the test's time limit."""

    def press() -> None:
        deadline = time.monotonic() + timeout
        while len(list(directory.glob(pattern))) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signum)  # SIGINT: what Ctrl-C (or a notebook's stop) sends

    thread = threading.Thread(target=press, daemon=True, name="ctrl-c")
    thread.start()
    return thread


def timed_out_while_running(
    attempt: Callable[[Path, float], Any],
    tmp_path: Path,
    timeouts: tuple[float, ...],
    ranks: int = 2,
    pattern: str = "*.pid",
) -> Any:
    """``attempt(folder, timeout)``, a run expected to time out, with each timeout in turn
    until one fired after all ``ranks`` ranks had started (each left a file matching
    ``pattern`` in the folder); that attempt's value is returned.

    A run's timeout counts from the call, and on a busy machine its ranks can take longer than
    a short timeout to start: an attempt whose timeout fired before every rank ran shows
    nothing about stopping running ranks, so the next tries a longer one. ``attempt`` itself
    checks what every attempt, early or not, must leave (no rank running, no folder).
    """
    count = 0
    for number, timeout in enumerate(timeouts):
        folder = tmp_path / f"attempt{number}"
        folder.mkdir()
        value = attempt(folder, timeout)
        count = len(list(folder.glob(pattern)))
        if count == ranks:
            return value
    raise AssertionError(
        f"only {count} of {ranks} ranks had started when timeout={timeouts[-1]:g}s fired: "
        "the machine is too slow to show running ranks being stopped"
    )


def recorded_pids(pid_dir: Path) -> list[int]:
    """The pids the ranks wrote with trainers.record_pid."""
    return [int(p.read_text()) for p in sorted(pid_dir.glob("*.pid"))]


def alive(pids: list[int]) -> list[int]:
    """Pids that still run (zombies count as gone: they have exited)."""
    living = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            continue
    return living


def worker_processes() -> list[psutil.Process]:
    """Every ``python -m sparktrain.worker`` process on this machine."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "sparktrain.worker" in cmdline:
            found.append(proc)
    return found


def wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    """Wait until none of ``pids`` runs (a killed task's ranks end when they see it gone)."""
    deadline = time.monotonic() + timeout
    while alive(pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"pids {alive(pids)} still run after {timeout}s")
        time.sleep(0.05)


def time_calls_only(config: Any, items: list[Any], chosen: Callable[[Any], bool]) -> None:
    """Give the ``chosen`` tests the suite's limit for a hung test on their own call
    (pytest-timeout's ``func_only``), where shared fixtures start a session, a cluster or a
    server in the setup of the first test that needs it, under limits of their own: on a busy
    machine that start alone can take longer than the limit. A test's own ``timeout`` mark is
    left as it is."""
    try:
        limit = float(config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout is not installed: no limit to move
        return
    if limit <= 0:
        return
    import pytest

    for item in items:
        if chosen(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit, func_only=True))


def under(folder: Path) -> Callable[[Any], bool]:
    """Whether a collected test is in ``folder`` (for :func:`time_calls_only`)."""
    return lambda item: folder in item.path.parents


def remove_fake_gpus(jvm_pid: int) -> None:
    """Remove the folder where conf/gpu-discovery.sh handed out a JVM's fake GPU ids (named
    after that JVM; the script sweeps those of ended JVMs only when it next runs)."""
    shutil.rmtree(
        Path(tempfile.gettempdir()) / f"sparktrain-fake-gpus.{jvm_pid}", ignore_errors=True
    )


def bench_module(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module (it imports its neighbour instruments.py)."""
    import importlib.util
    import sys

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module
