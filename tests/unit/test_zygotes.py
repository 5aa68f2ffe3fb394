"""Warm starts: ranks forked from a zygote that imported torch behave like fresh workers.

Each test forks real ranks (``python -m sparktrain.worker`` semantics: payload in, record
out) from a real zygote, and checks what the rank sees and what its supervisor hears.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sparktrain import contract, wire
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.shipping.payload import dump_call, load_result
from sparktrain.task import zygote_client, zygotes
from sparktrain.task.assignment import TaskJob
from sparktrain.task.connect_stage import DetachedSession
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.process import RankProcess
from sparktrain.wire import protocol
from sparktrain.worker.zygote import HOLD_MOST
from tests.unit.test_supervise import ROOT, _expect_both, _lines_of, wait_gone

# Functions pickled by value (like a notebook's), so the ranks need no tests/ package.
CELL = """
import os, sys, time


def place():
    loaded_before = "torch" in sys.modules
    import torch
    return {
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(),
        "rank": os.environ.get("RANK"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gloo": os.environ.get("GLOO_SOCKET_IFNAME"), "omp": os.environ.get("OMP_NUM_THREADS"),
        "threads": torch.get_num_threads(), "torch_loaded_before": loaded_before,
        "cuda_initialized": torch.cuda.is_initialized(),
        "draws": [__import__("random").random(), __import__("numpy").random.random()],
    }


def fail():
    print("about to fail", flush=True)
    raise ValueError("bad batch")


def leave(code):
    os._exit(code)


def nap(seconds):
    print("napping", flush=True)
    time.sleep(seconds)

"""


def cell(name: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {"__name__": "sparktrain_test_zygote_cell"}
    exec(compile(CELL, "<cell>", "exec"), scope)
    return scope[name]  # type: ignore[no-any-return]


class Ranks:
    """Starts ranks from zygotes and collects what they report."""

    def __init__(self, tmp_path: Path, cwd: Path) -> None:
        self.tmp = tmp_path
        self.cwd = str(cwd)
        self.zygotes: dict[int, zygotes.Zygote] = {}
        self.procs: list[RankProcess] = []
        self.exits: dict[int, int] = {}
        self.lines: dict[int, list[str]] = {}
        self.exited = threading.Condition()  # also notified on each line

    def _on_line(self, rank: int, line: str) -> None:
        with self.exited:
            self.lines.setdefault(rank, []).append(line)
            self.exited.notify_all()

    def _on_exit(self, rank: int, code: int) -> None:
        with self.exited:
            self.exits[rank] = code
            self.exited.notify_all()

    def env(self, rank: int, **extra: str) -> dict[str, str]:
        folder = self.tmp / f"rank{rank}"
        folder.mkdir(exist_ok=True)
        paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            contract.PAYLOAD_ENV: str(folder / "payload.pkl"),
            contract.ERROR_ENV: str(folder / "error.json"),
            contract.RESULT_ENV: str(folder / "result.pkl"),
            contract.GRACE_ENV: "1",
            **extra,
        }

    def start(self, rank: int, fn: Callable[..., Any], *args: Any, **env: str) -> RankProcess:
        full = self.env(rank, **env)
        Path(full[contract.PAYLOAD_ENV]).write_bytes(dump_call(fn, args, {}, 1 << 20))
        zygote = zygotes.zygote_for(full, self.cwd, wait=120)
        assert zygote is not None, "no usable zygote"
        self.zygotes[rank] = zygote
        proc = RankProcess(
            rank,
            [sys.executable, "-m", "sparktrain.worker"],
            full,
            self.cwd,
            on_line=self._on_line,
            on_exit=self._on_exit,
            dumps_stacks=True,
            zygote=zygote,
        )
        assert proc.forked
        self.procs.append(proc)
        return proc

    def exit_code(self, rank: int, timeout: float = 30.0) -> int:
        with self.exited:
            assert self.exited.wait_for(lambda: rank in self.exits, timeout), "no exit"
        return self.exits[rank]

    def result(self, rank: int) -> Any:
        return load_result((self.tmp / f"rank{rank}" / "result.pkl").read_bytes())

    def error(self, rank: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.tmp / f"rank{rank}" / "error.json").read_text())
        return data


@pytest.fixture(scope="module")
def ranks_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ranks' folder, the same for every test, so that they share a zygote."""
    yield tmp_path_factory.mktemp("cwd")
    with zygotes._zygotes_lock:
        for zygote in zygotes._zygotes.values():
            zygote.close()
            zygote.proc.wait(10)
        zygotes._zygotes.clear()


@pytest.fixture
def ranks(tmp_path: Path, ranks_cwd: Path) -> Iterator[Ranks]:
    made = Ranks(tmp_path, ranks_cwd)
    yield made
    for proc in made.procs:
        if proc.proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.join(5)


def test_a_forked_rank_gets_its_own_place_and_returns(ranks: Ranks) -> None:
    first = ranks.start(0, cell("place"), CUDA_VISIBLE_DEVICES="", GLOO_SOCKET_IFNAME="eth9")
    second = ranks.start(1, cell("place"), CUDA_VISIBLE_DEVICES="1", GLOO_SOCKET_IFNAME="ib0")
    assert ranks.exit_code(0) == 0 and ranks.exit_code(1) == 0
    zygote = ranks.zygotes[0]
    assert ranks.zygotes[1] is zygote
    got = [ranks.result(0), ranks.result(1)]
    for proc, seen, rank, cuda, gloo in zip(
        (first, second), got, ("0", "1"), ("", "1"), ("eth9", "ib0"), strict=True
    ):
        # One zygote forked both; each rank leads its own session, in the task's folder.
        assert seen["pid"] == proc.pid and seen["ppid"] == zygote.proc.pid
        assert seen["sid"] == proc.pid and seen["cwd"] == ranks.cwd
        # The late variables are the rank's own, set before its function ran.
        assert (seen["rank"], seen["cuda"], seen["gloo"]) == (rank, cuda, gloo)
        assert seen["omp"] == "1" and seen["threads"] == 1
        assert seen["cuda_initialized"] is False
    # The rank's process had torch loaded before its function arrived: it was forked warm.
    assert got[0]["torch_loaded_before"] is True
    # Like new interpreters, the two ranks draw different numbers from random and numpy.
    assert got[0]["draws"][0] != got[1]["draws"][0]
    assert got[0]["draws"][1] != got[1]["draws"][1]


def test_a_cold_rank_starts_no_zygote_and_a_loading_one_is_waited_for(ranks: Ranks) -> None:
    env = ranks.env(0, OMP_NUM_THREADS="4")  # an environment no zygote serves yet
    key = zygotes.import_key(env, ranks.cwd)
    # What a launcher asks for a rank: none fits, so the rank starts cold, and nothing loads
    # beside it.
    assert zygotes.zygote_for(env, ranks.cwd, wait=120, start=False) is None
    assert key not in zygotes._zygotes
    # Once the cold ranks ended, the launcher starts one; it does not wait for it to load.
    assert zygotes.zygote_for(env, ranks.cwd) is None
    loading = zygotes._zygotes[key]
    # The next rank waits for it to load, and forks from it.
    assert zygotes.zygote_for(env, ranks.cwd, wait=120, start=False) is loading
    assert loading.usable()
    loading.close()


def test_a_zygote_that_does_not_load_in_time_is_given_up(
    ranks: Ranks, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    (stuck / "sitecustomize.py").write_text("import time\ntime.sleep(120)\n")
    env = ranks.env(0, OMP_NUM_THREADS="6")
    env["PYTHONPATH"] = os.pathsep.join([str(stuck), env["PYTHONPATH"]])
    key = zygotes.import_key(env, ranks.cwd)
    assert zygotes.zygote_for(env, ranks.cwd) is None  # started: it never loads
    hung = zygotes._zygotes[key]
    with caplog.at_level(logging.WARNING, logger="sparktrain"):
        assert zygotes.zygote_for(env, ranks.cwd, wait=1, start=False) is None
    assert f"a zygote (pid {hung.pid}) did not load within 1s" in caplog.text
    assert key in zygotes._unusable and key not in zygotes._zygotes
    try:
        # The ranks of that environment start cold at once from then on, without waiting.
        assert zygotes.zygote_for(env, ranks.cwd, wait=120) is None
        assert hung.proc is not None
        hung.proc.wait(15)  # given up: ended and reaped, not left running
    finally:
        zygotes._unusable.discard(key)


TWO_RUNS = r"""
import os, sys
from sparktrain import SparkRunner


def zygotes_beside():
    # The zygote processes whose parent is this rank's (the driver).
    parent, found = os.getppid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmd:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                found += ppid == parent and b"sparktrain.worker.zygote" in cmd.read()
        except OSError:
            continue
    return found


runner = SparkRunner(np=-2)
beside = runner.run(zygotes_beside)
print("RUN", beside, runner.last_run.attempts[-1].breakdown["forked"], flush=True)
# A forked rank's parent is the zygote, and its fellow rank a child of it with the same command
# line: what it would count says nothing, so only how it started is printed.
runner.run(zygotes_beside)
print("RUN -", runner.last_run.attempts[-1].breakdown["forked"], flush=True)
"""


def test_a_zygote_loads_after_the_cold_ranks_and_the_next_run_forks(tmp_path: Path) -> None:
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", TWO_RUNS],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
        check=False,
    )
    runs = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RUN")]
    assert done.returncode == 0, done.stderr[-3000:]
    # The first run's ranks started cold with no zygote loading beside them; the second run
    # waited for the zygote started after them, and forked.
    assert runs == [["0", "False"], ["-", "True"]], done.stderr[-3000:]


def test_a_zygote_with_running_ranks_is_never_let_go(ranks: Ranks) -> None:
    napper = ranks.start(0, cell("nap"), 60, OMP_NUM_THREADS="5")
    busy = ranks.zygotes[0]
    assert "napping" in _wait_line(ranks, 0, "napping")
    # Fill the process's zygotes with other environments: the busy one must stay.
    for threads in ("6", "7"):
        env = ranks.env(9, OMP_NUM_THREADS=threads)
        zygotes.zygote_for(env, ranks.cwd, wait=120)
    assert not busy.gone and busy.proc.poll() is None
    assert napper.proc.poll() is None  # its rank still runs
    assert len(zygotes._zygotes) <= zygotes.MAX_ZYGOTES
    os.kill(napper.pid, signal.SIGKILL)
    assert ranks.exit_code(0) == -signal.SIGKILL  # and its end still reaches the supervisor


def test_another_early_variable_gets_another_zygote(ranks: Ranks) -> None:
    ranks.start(0, cell("place"), OMP_NUM_THREADS="1")
    ranks.start(1, cell("place"), OMP_NUM_THREADS="2")
    assert ranks.exit_code(0) == 0 and ranks.exit_code(1) == 0
    one, two = ranks.result(0), ranks.result(1)
    assert one["ppid"] != two["ppid"]  # two zygotes: OMP_NUM_THREADS is read when torch loads
    assert (one["omp"], one["threads"]) == ("1", 1)
    assert (two["omp"], two["threads"]) == ("2", 2)


def test_how_a_forked_rank_ended_reaches_its_supervisor(ranks: Ranks) -> None:
    ranks.start(0, cell("fail"))
    ranks.start(1, cell("leave"), 7)
    napper = ranks.start(2, cell("nap"), 60)
    assert ranks.exit_code(0) == 1
    error = ranks.error(0)
    assert (error["exc_type"], error["message"], error["phase"]) == (
        "ValueError",
        "bad batch",
        "run",
    )
    assert "about to fail" in ranks.lines[0]
    assert ranks.exit_code(1) == 7
    # A stack dump works in a forked rank, then a stop ends its whole session.
    stack = napper.dump_stack(timeout=10)
    assert stack is not None and stack.frames[0].name == "nap"
    os.kill(napper.pid, signal.SIGKILL)
    assert ranks.exit_code(2) == -signal.SIGKILL


def test_a_rank_whose_zygote_dies_is_ended_and_reported(ranks: Ranks) -> None:
    napper = ranks.start(0, cell("nap"), 60)
    assert "napping" in _wait_line(ranks, 0, "napping")
    zygote = ranks.zygotes[0]
    zygote.proc.send_signal(signal.SIGKILL)
    assert ranks.exit_code(0) == -signal.SIGKILL
    assert wait_gone(napper.pid, 5.0)
    # The next rank gets a new zygote.
    ranks.start(1, cell("place"))
    assert ranks.exit_code(1) == 0
    assert ranks.result(1)["ppid"] != zygote.proc.pid


def _wait_line(ranks: Ranks, rank: int, text: str, timeout: float = 30.0) -> str:
    with ranks.exited:
        ranks.exited.wait_for(lambda: text in ranks.lines.get(rank, []), timeout)
    assert text in ranks.lines.get(rank, []), ranks.lines
    return text


def test_an_unused_zygote_exits_by_itself(ranks: Ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zygote_client, "ZYGOTE_IDLE", 1.0)
    ranks.start(0, cell("place"), OMP_NUM_THREADS="3")  # a zygote of its own, made now
    assert ranks.exit_code(0) == 0
    assert ranks.zygotes[0].proc.wait(timeout=15) == 0


OWNER = r"""
import os, sys, time
from sparktrain import contract, wire
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.task import zygote_client, zygotes
from sparktrain.task.assignment import TaskJob
from sparktrain.task.connect_stage import DetachedSession
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.process import RankProcess
from sparktrain.wire import protocol
from sparktrain.worker.zygote import HOLD_MOST

payload, workdir = sys.argv[1], sys.argv[2]
env = dict(os.environ)
env.update({contract.PAYLOAD_ENV: payload, contract.GRACE_ENV: "1",
            contract.ERROR_ENV: os.path.join(workdir, contract.error_file_name(0))})
zygote = zygotes.zygote_for(env, workdir, wait=120)
proc = RankProcess(0, [sys.executable, "-m", "sparktrain.worker"], env, workdir,
                   on_line=lambda rank, line: sys.stdout.write(f"LINE {line}\n"),
                   on_exit=lambda rank, code: sys.stdout.write(f"EXIT {code}\n"),
                   zygote=zygote)
sys.stdout.write(f"RANK {proc.pid} {zygote.proc.pid} {proc.forked}\n")
sys.stdout.flush()
time.sleep(60)
"""


def test_zygote_and_rank_die_with_their_owner(tmp_path: Path) -> None:
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(dump_call(cell("nap"), (60,), {}, 1 << 20))
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(payload), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    pids: list[int] = []
    try:
        lines = _lines_of(owner)
        # A rank forked warm prints at once: its line may come before the owner's own.
        rank_line, _ = _expect_both(lines, "RANK", "LINE napping", 60)
        _, rank_pid, zygote_pid, forked = rank_line.split()
        pids = [int(rank_pid), int(zygote_pid)]
        assert forked == "True"
        assert psutil.Process(pids[0]).ppid() == pids[1]
        owner.send_signal(signal.SIGKILL)
        owner.wait(5)
        # The rank sees its lifeline close (SIGTERM, SIGKILL after the 1 s grace); the zygote
        # sees its socket close.
        assert wait_gone(pids[0], 5.0), "the rank outlived its killed owner"
        assert wait_gone(pids[1], 5.0), "the zygote outlived its killed owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(5)
        for pid in pids:
            if not wait_gone(pid, 0.1):
                os.kill(pid, signal.SIGKILL)


def test_a_zygote_that_hangs_after_its_socket_ended_is_killed_and_reaped() -> None:
    # Its socket ended (what _read sees) but the process lives on: a stuck zygote. _lost must
    # not raise in the reader thread (it did: TimeoutExpired), nor leave the process behind.
    ours, theirs = socket.socketpair()
    theirs.close()
    stuck = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    zygote = object.__new__(zygotes.Zygote)
    zygote.proc, zygote._sock, zygote._ranks = stuck, ours, {}
    zygote._ready, zygote._replies = threading.Event(), queue.Queue()
    zygote._lost()
    assert zygote.gone
    assert stuck.returncode == -signal.SIGKILL


def _held(zygote: zygotes.Zygote) -> bool:
    """Whether ``zygote`` waits on its hold: asleep in select with torch not loaded (once it
    has loaded, it serves its owner from a select, with torch mapped)."""
    pid = zygote.proc.pid if zygote.proc is not None else zygote.pid

    def waiting() -> bool:
        try:
            return "poll" in Path(f"/proc/{pid}/wchan").read_text() or zygote.loaded()
        except OSError:
            return True

    assert _wait_for(waiting, 60), "the zygote never got to wait"
    return "libtorch" not in Path(f"/proc/{pid}/maps").read_text() and not zygote.loaded()


def _wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not condition():
            if deadline.wait(0.05):
                return condition()
        return True
    finally:
        timer.cancel()


def _start_held(ranks: Ranks, threads: str) -> tuple[zygotes.Zygote, int, dict[str, str]]:
    """A zygote of a new environment, held by a pipe: (it, the pipe's write end, the env)."""
    env = ranks.env(0, OMP_NUM_THREADS=threads)
    theirs, gate = os.pipe()
    try:
        assert zygotes.zygote_for(env, ranks.cwd, hold=theirs) is None
    finally:
        os.close(theirs)
    return zygotes._zygotes[zygotes.import_key(env, ranks.cwd)], gate, env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_held_zygote_loads_only_once_its_hold_ends(ranks: Ranks) -> None:
    held, gate, env = _start_held(ranks, "3")
    try:
        assert _held(held)
        os.write(gate, b"what arrives meanwhile is dropped")
        assert _held(held)
    finally:
        os.close(gate)
    # The hold ended: it loads, and the next rank forks from it.
    assert zygotes.zygote_for(env, ranks.cwd, wait=120, start=False) is held
    assert held.usable()
    held.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_held_zygote_whose_owner_went_away_exits_without_loading(ranks: Ranks) -> None:
    held, gate, _env = _start_held(ranks, "5")
    try:
        del zygotes._zygotes[held.key]
        assert _held(held)
        held.close()
        assert held.proc is not None
        # Ended by its owner's leaving, well before HOLD_MOST would have let it load.
        assert held.proc.wait(HOLD_MOST / 2) == 0
        assert held.info is None
    finally:
        os.close(gate)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_task_s_zygote_loads_once_the_driver_closes_its_connection(ranks: Ranks) -> None:
    """A finished task's zygotes hold its connection to the driver (not shut: the driver sees
    it open) and load when the driver closes it, after the job's end."""
    env = ranks.env(0, OMP_NUM_THREADS="7")
    key = zygotes.import_key(env, ranks.cwd)
    with ChannelServer(wire.new_key()) as server:
        job = TaskJob(
            run_id="holdtest",
            attempt=0,
            config=RunConfig(np=1).to_json(),
            channel=server.address,
            key=server.key,
            payload=b"",
        )
        session = TaskSession(job, wire.ChannelClient(server.address, server.key, timeout=10))
        session.cwd = ranks.cwd
        session.listen()
        session.send(protocol.EXITED(index=0))
        assert server.events.get(timeout=10)[1]["type"] == protocol.EXITED.name
        session.warm_later(env, ranks.cwd)
        session.finish()
        session.finish()  # again, as a first stage's task does when it ends: nothing more
        held = zygotes._zygotes[key]
        assert session.client is not None and session.client.closed
        assert _held(held)
        assert server.events.empty()  # the task's connection is still open
        # This process's descriptor stays open while its reader reads it.
        assert session.client.fileno() >= 0
    # The driver closed it: the zygote loads, and the reader closed this end.
    assert zygotes.zygote_for(env, ranks.cwd, wait=120, start=False) is held
    assert _wait_for(lambda: session.client.fileno() == -1, 30)
    held.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_detached_task_s_zygote_loads_once_its_output_is_out(ranks: Ranks) -> None:
    env = ranks.env(0, OMP_NUM_THREADS="8")
    key = zygotes.import_key(env, ranks.cwd)
    job = TaskJob(
        run_id="detachedhold",
        attempt=0,
        config=RunConfig(np=1).to_json(),
        channel="",
        key=b"k" * 32,
        payload=b"",
    )
    session = DetachedSession(job, None)
    session.warm_later(env, ranks.cwd)
    session.finish()
    session.finish()  # idempotent: nothing closed twice
    held = zygotes._zygotes[key]
    assert _held(held)
    session.output_out()
    assert zygotes.zygote_for(env, ranks.cwd, wait=120, start=False) is held
    held.close()
    session.output_out()
