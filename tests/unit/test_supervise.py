"""RankProcess: output pump, exit codes, SIGTERM -> SIGKILL, process groups, the lifeline.

These start real (tiny) processes, so they are the slowest unit tests; each stays well
under a second or two.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from sparktrain.contract import PARENT_FD_ENV
from sparktrain.shipping.payload import dump_call
from sparktrain.task import process
from sparktrain.task.process import TAIL_LINES, RankProcess, stop_all

ROOT = Path(__file__).resolve().parents[2]


class Watch:
    """Collects what a RankProcess reports, with events to wait on instead of sleeping."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.exits: list[tuple[int, int]] = []
        self.exited = threading.Event()
        self._line_added = threading.Condition()

    def on_line(self, rank: int, line: str) -> None:
        with self._line_added:
            self.lines.append((rank, line))
            self._line_added.notify_all()

    def on_exit(self, rank: int, code: int) -> None:
        self.exits.append((rank, code))
        self.exited.set()

    def wait_line(self, prefix: str, timeout: float = 10.0) -> str:
        with self._line_added:
            found = self._line_added.wait_for(
                lambda: any(line.startswith(prefix) for _, line in self.lines), timeout
            )
        assert found, f"no line starting with {prefix!r} in {self.lines}"
        return next(line for _, line in self.lines if line.startswith(prefix))


def spawn(
    started: list[RankProcess], tmp_path: Path, code: str, rank: int = 0, watch: Watch | None = None
) -> tuple[RankProcess, Watch]:
    watch = watch or Watch()
    proc = RankProcess(
        rank,
        [sys.executable, "-c", textwrap.dedent(code)],
        dict(os.environ),
        str(tmp_path),
        on_line=watch.on_line,
        on_exit=watch.on_exit,
    )
    started.append(proc)
    return proc, watch


def gone(pid: int) -> bool:
    """Ended (a zombie nobody reaped yet counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


# --- output and exit codes ---------------------------------------------------------------------


def test_output_reaches_on_line_and_tail_and_exit_code_on_exit(
    started: list[RankProcess], tmp_path: Path
) -> None:
    proc, watch = spawn(
        started,
        tmp_path,
        """
        import sys
        print("hello")
        print("to stderr", file=sys.stderr)
        sys.stdout.write("crlf\\r\\n")
        print("last", flush=True)
        sys.exit(3)
        """,
        rank=5,
    )
    assert proc.join(10)
    assert watch.exits == [(5, 3)]
    lines = [line for _, line in watch.lines]
    assert set(lines) == {"hello", "to stderr", "crlf", "last"}  # stderr is merged
    assert lines.index("hello") < lines.index("crlf") < lines.index("last")
    assert {rank for rank, _ in watch.lines} == {5}
    assert list(proc.tail) == lines
    assert proc.exit_time is not None and proc.exit_time <= time.time()
    assert proc.stopped_by_supervisor is False


def test_cwd_env_and_own_session(started: list[RankProcess], tmp_path: Path) -> None:
    proc, watch = spawn(
        started,
        tmp_path,
        f"""
        import os
        print("cwd", os.getcwd())
        print("sid", os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())
        fd = int(os.environ["{PARENT_FD_ENV}"])
        os.set_blocking(fd, False)
        try:
            os.read(fd, 1)
        except BlockingIOError:
            print("lifeline open")
        """,
    )
    assert proc.join(10)
    lines = [line for _, line in watch.lines]
    assert f"cwd {tmp_path}" in lines
    assert "sid True True" in lines  # session and process-group leader
    assert "lifeline open" in lines  # readable end, nothing written, not closed
    assert watch.exits == [(0, 0)]


def test_undecodable_output_is_replaced(started: list[RankProcess], tmp_path: Path) -> None:
    proc, watch = spawn(
        started,
        tmp_path,
        """
        import sys
        sys.stdout.buffer.write(b"bad \\xff\\xfe bytes\\n")
        """,
    )
    assert proc.join(10)
    assert watch.lines == [(0, "bad \ufffd\ufffd bytes")]


def test_tail_keeps_the_last_lines(started: list[RankProcess], tmp_path: Path) -> None:
    n = TAIL_LINES + 50
    proc, watch = spawn(started, tmp_path, f"for i in range({n}): print(i)")
    assert proc.join(10)
    assert len(watch.lines) == n
    assert list(proc.tail) == [str(i) for i in range(n - TAIL_LINES, n)]


def test_a_raising_on_line_does_not_stop_the_pump(
    started: list[RankProcess], tmp_path: Path
) -> None:
    seen: list[str] = []

    def on_line(rank: int, line: str) -> None:
        seen.append(line)
        raise RuntimeError("log sink broken")

    exited = threading.Event()
    proc = RankProcess(
        0,
        [sys.executable, "-c", "print('a'); print('b')"],
        dict(os.environ),
        str(tmp_path),
        on_line=on_line,
        on_exit=lambda r, c: exited.set(),
    )
    started.append(proc)
    assert proc.join(10) and exited.is_set()
    assert seen == ["a", "b"] and list(proc.tail) == ["a", "b"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_death_by_signal_is_a_negative_exit_code(
    started: list[RankProcess], tmp_path: Path, sig: signal.Signals
) -> None:
    proc, watch = spawn(started, tmp_path, f"import os; os.kill(os.getpid(), {int(sig)})")
    assert proc.join(10)
    assert watch.exits == [(0, -int(sig))]


def test_failed_start_leaks_no_descriptor(tmp_path: Path) -> None:
    me = psutil.Process()
    before = me.num_fds()
    with pytest.raises(FileNotFoundError):
        RankProcess(
            0,
            [str(tmp_path / "no-such-python")],
            dict(os.environ),
            str(tmp_path),
            on_line=lambda r, line: None,
            on_exit=lambda r, c: None,
        )
    assert me.num_fds() == before


def test_lifeline_closes_when_the_rank_has_ended(
    started: list[RankProcess], tmp_path: Path
) -> None:
    me = psutil.Process()
    before = me.num_fds()
    proc, _ = spawn(started, tmp_path, "pass")
    assert proc.join(10)
    assert me.num_fds() == before  # lifeline and stdout pipe both closed


# --- stopping ----------------------------------------------------------------------------------


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every (process group, signal) that ``stop`` sends, in the order sent (the group's
    clean-up SIGKILL once a rank has ended comes from its waiter, and is left out)."""
    sent: list[tuple[int, int]] = []
    real = process._signal_group

    def logged(pgid: int, sig: int) -> None:
        if sys._getframe(1).f_code.co_name == "stop":
            sent.append((pgid, sig))  # list.append is atomic: stop_all's threads share this
        real(pgid, sig)

    monkeypatch.setattr(process, "_signal_group", logged)
    return sent


def test_stop_terminates_a_cooperative_process(
    started: list[RankProcess], tmp_path: Path, signals: list[tuple[int, int]]
) -> None:
    proc, watch = spawn(
        started, tmp_path, "import time; print('ready', flush=True); time.sleep(60)"
    )
    watch.wait_line("ready")
    proc.stop(grace=60.0)
    assert proc.proc.poll() is not None  # stop returns once the process has ended
    assert proc.join(10)  # reaped and reported by its own waiter thread (which may lag)
    assert signals == [(proc.pid, signal.SIGTERM)]  # SIGTERM was enough; no SIGKILL
    assert watch.exits == [(0, -signal.SIGTERM)]
    assert proc.stopped_by_supervisor is True


def test_stop_escalates_to_sigkill_and_kills_the_group(
    started: list[RankProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rank ignores SIGTERM, and so does its child (SIG_IGN survives fork and exec).
    proc, watch = spawn(
        started,
        tmp_path,
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("grandchild", child.pid, flush=True)
        time.sleep(60)
        """,
    )
    grandchild = int(watch.wait_line("grandchild").split()[1])
    assert not gone(grandchild)
    assert psutil.Process(grandchild).ppid() == proc.pid
    assert os.getpgid(grandchild) == proc.pid  # same process group as the rank
    events: list[object] = []
    real = process._signal_group

    def logged_signal(pgid: int, sig: int) -> None:
        if sys._getframe(1).f_code.co_name == "stop":  # not the waiter's clean-up
            events.append(sig)
        real(pgid, sig)

    monkeypatch.setattr(process, "_signal_group", logged_signal)
    waited = proc.proc.wait

    def logged_wait(timeout: float | None = None) -> int:
        try:
            return waited(timeout)
        except subprocess.TimeoutExpired:
            events.append(f"no exit within {timeout}s")
            raise

    monkeypatch.setattr(proc.proc, "wait", logged_wait)
    proc.stop(0.5)
    assert proc.join(10)
    # SIGKILL only once the grace period ran out without an exit.
    assert events == [signal.SIGTERM, "no exit within 0.5s", signal.SIGKILL]
    assert watch.exits == [(0, -signal.SIGKILL)]
    assert wait_gone(grandchild, 2.0), "the rank's child outlived stop()"


def test_children_die_with_a_rank_that_exits(started: list[RankProcess], tmp_path: Path) -> None:
    proc, watch = spawn(
        started,
        tmp_path,
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("grandchild", child.pid, flush=True)
        """,
    )
    grandchild = int(watch.wait_line("grandchild").split()[1])
    assert proc.join(10)
    assert watch.exits == [(0, 0)]
    assert wait_gone(grandchild, 2.0), "a child of an ended rank was left running"


def test_stop_after_exit_is_a_no_op(started: list[RankProcess], tmp_path: Path) -> None:
    proc, watch = spawn(started, tmp_path, "pass")
    assert proc.join(10)
    proc.stop(grace=5.0)
    assert proc.stopped_by_supervisor is False
    assert watch.exits == [(0, 0)]


def test_stop_all_stops_in_parallel(
    started: list[RankProcess], tmp_path: Path, signals: list[tuple[int, int]]
) -> None:
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """
    procs = []
    for rank in range(3):
        proc, watch = spawn(started, tmp_path, code, rank=rank)
        procs.append((proc, watch))
    for _, watch in procs:
        watch.wait_line("ready")
    stop_all([p for p, _ in procs], grace=0.5)
    for proc, _ in procs:
        assert proc.join(10)
    # In parallel: every rank had its SIGTERM before any grace period ran out (one after
    # another would read TERM, KILL, TERM, KILL, ...).
    pids = {p.pid for p, _ in procs}
    assert len(signals) == 6
    assert {pgid for pgid, _ in signals[:3]} == pids and {s for _, s in signals[:3]} == {
        signal.SIGTERM
    }
    assert {pgid for pgid, _ in signals[3:]} == pids and {s for _, s in signals[3:]} == {
        signal.SIGKILL
    }
    assert [w.exits for _, w in procs] == [[(r, -signal.SIGKILL)] for r in range(3)]


# --- the lifeline: a rank does not outlive its supervisor --------------------------------------

SUPERVISOR = """
import os, sys, time
from sparktrain import contract
from sparktrain.task.process import RankProcess

payload, workdir = sys.argv[1], sys.argv[2]
env = dict(os.environ)
env.update({
    contract.PAYLOAD_ENV: payload,
    contract.ERROR_ENV: os.path.join(workdir, contract.error_file_name(0)),
    contract.GRACE_ENV: "1",
})
proc = RankProcess(0, [sys.executable, "-m", "sparktrain.worker"], env, workdir,
                   on_line=lambda rank, line: print("LINE", line, flush=True),
                   on_exit=lambda rank, code: print("EXIT", code, flush=True))
print("WORKER", proc.pid, flush=True)
time.sleep(60)
"""

NAP_CELL = """
import time


def nap(seconds):
    print("napping", flush=True)
    time.sleep(seconds)
"""


def _lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _expect(lines: queue.Queue[str], prefix: str | tuple[str, ...], timeout: float = 15.0) -> str:
    """The first line that starts with ``prefix`` (or one of them); the lines before it are
    passed over."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith(prefix):
            return line
        seen.append(line)
    raise AssertionError(f"no line starting with {prefix!r}; got {seen}")


def _expect_both(lines: queue.Queue[str], first: str, second: str, timeout: float) -> list[str]:
    """The lines starting with ``first`` and ``second``, in that order, whichever came first:
    a process's own line and the lines relayed from its rank's reader thread are not ordered."""
    got: dict[str, str] = {}
    for _ in range(2):
        line = _expect(lines, tuple(p for p in (first, second) if p not in got), timeout)
        got[first if line.startswith(first) else second] = line
    return [got[first], got[second]]


def test_worker_dies_when_its_supervisor_is_killed(tmp_path: Path) -> None:
    # A function pickled by value (like one from a notebook), so the worker needs no tests/.
    cell: dict[str, object] = {"__name__": "sparktrain_test_nap_cell"}
    exec(compile(NAP_CELL, "<cell>", "exec"), cell)
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(dump_call(cell["nap"], (60,), {}, 1 << 20))  # type: ignore[arg-type]

    # The supervisor and the worker import sparktrain from this checkout.
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(payload), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    worker_pid = None
    try:
        lines = _lines_of(supervisor)
        # Once both have come, the worker is inside the user's function.
        worker_pid = int(_expect_both(lines, "WORKER", "LINE napping", 15)[0].split()[1])
        worker = psutil.Process(worker_pid)
        assert "sparktrain.worker" in worker.cmdline()
        assert worker.ppid() == supervisor.pid

        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(5)
        # SIGTERM goes out as soon as the pipe closes; the grace (1 s) bounds the SIGKILL.
        assert wait_gone(worker_pid, 10.0), "the worker outlived its killed supervisor"
        assert not (tmp_path / "error-0.json").exists()  # killed, not a Python error
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(5)
        if worker_pid is not None and not gone(worker_pid):
            os.killpg(worker_pid, signal.SIGKILL)
