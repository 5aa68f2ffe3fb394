"""mpirun's remote shell without SSH, with a fake daemon command instead of Open MPI's orted:
the agent (``python -m sparktrain.task.mpi.rsh``) ↔ a task's real daemon role, the guard that
ties launchers to their task, and the worker's adoption of its MPI rank. No MPI needed."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sparktrain import contract, wire
from sparktrain.backends import get_backend
from sparktrain.config import RunConfig
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec
from sparktrain.shipping.payload import dump_call, load_result
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.mpi.mpi_launcher import MpiRun, MpiTask
from sparktrain.task.mpi.peers import PeerServer
from tests.helpers import alive, wait_for, wait_gone

KEY = b"k" * 32


class FakeLauncher:
    """Rank 0's task, as far as a daemon task can tell: a PeerServer collecting messages."""

    def __init__(self) -> None:
        self.messages: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self.server = PeerServer(KEY, lambda *event: self.messages.put(event), bind="127.0.0.1")

    def next(self, kind: str, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            event, conn_id, message = self.messages.get(
                timeout=max(0.1, deadline - time.monotonic())
            )
            if event == "peer" and message.get("type") == kind:
                return conn_id, message


@pytest.fixture
def daemon_task():
    """Task 1 of a two-"host" MPI run, in its daemon role, in a thread; yields
    (launcher, agent env, result holder)."""
    launcher = FakeLauncher()
    config = RunConfig(np=2, backend="horovod", launcher="mpi", grace_period=1)
    job = TaskJob(
        run_id="rshtest",
        attempt=0,
        config=config.to_json(),
        channel="127.0.0.1:9",
        key=KEY,
        payload=b"unused",
    )
    supervisor = TaskSession(job, None)
    server = PeerServer(KEY, lambda *event: supervisor.events.put(event), bind="127.0.0.1")
    spec = build_cluster_spec(
        [
            TaskInfo(index=0, host="127.0.0.1", port=launcher.server.port),
            TaskInfo(index=1, host="127.0.0.2", port=server.port),
        ]
    )
    task = MpiTask(MpiRun(supervisor, spec, get_backend("horovod"), server, local=False), 1)
    result: dict[str, Any] = {}

    def body() -> None:
        result["records"] = task.run()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    env = dict(os.environ)
    env[contract.RSH_PEERS_ENV] = json.dumps({"127.0.0.2": f"127.0.0.1:{server.port}"})
    env["_SPARKTRAIN_KEY"] = KEY.hex()
    yield launcher, env, result, thread
    supervisor.events.put(("abort", -1, "test over"))
    thread.join(timeout=30)
    server.close()
    launcher.server.close()


def agent(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sparktrain.task.mpi.rsh", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_agent_runs_the_command_on_the_task_and_relays_its_exit(daemon_task):
    launcher, env, result, thread = daemon_task
    member, hello = launcher.next("member")
    assert hello["index"] == 1
    command = (
        "echo daemon-out; echo daemon-err >&2; "
        'echo \'{"exc_type": "E", "message": "m"}\' > "$_SPARKTRAIN_OUTCOME_DIR/error-1.json";'
        " exit 7"
    )
    proc = agent(env, "127.0.0.2", command)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert "daemon-out" in err and "daemon-err" in err  # relayed as ssh would
    _, started = launcher.next("daemon_started")
    assert started["host"] == "127.0.0.2"
    _, done = launcher.next("host_done")
    assert done["code"] == 7 and done["host"] == "127.0.0.2"
    assert done["errors"] == {"1": {"exc_type": "E", "message": "m"}}
    assert "daemon-out" in done["tail"]
    launcher.server.send(member, {"type": "release"})
    thread.join(timeout=30)
    assert result["records"] == []  # the launcher reports every rank


def test_a_killed_agent_stops_the_daemon(daemon_task, tmp_path):
    launcher, env, _, _ = daemon_task
    launcher.next("member")
    pid_file = tmp_path / "daemon.pid"
    proc = agent(env, "127.0.0.2", f"echo $$ > {pid_file}; exec sleep 60")
    launcher.next("daemon_started")
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the daemon's pid")
    daemon_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)  # what mpirun does to its agents when it stops
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    _, done = launcher.next("host_done")
    assert done["code"] != 0
    assert not psutil.pid_exists(daemon_pid) or (
        psutil.Process(daemon_pid).status() == psutil.STATUS_ZOMBIE
    )


def test_one_daemon_per_host_and_only_served_hosts(daemon_task):
    launcher, env, _, _ = daemon_task
    launcher.next("member")
    first = agent(env, "127.0.0.2", "exec sleep 60")
    launcher.next("daemon_started")
    second = agent(env, "127.0.0.2", "echo must-not-run")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 255 and "must-not-run" not in err
    unknown = agent(env, "elsewhere", "true")
    _, err = unknown.communicate(timeout=60)
    assert unknown.returncode == 255 and "no task of this run serves host 'elsewhere'" in err
    first.terminate()
    first.wait(timeout=30)


def test_agent_with_the_wrong_key_is_refused(daemon_task):
    launcher, env, _, _ = daemon_task
    launcher.next("member")
    proc = agent({**env, "_SPARKTRAIN_KEY": (b"x" * 32).hex()}, "127.0.0.2", "echo ran")
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 255 and "ran" not in err
    with pytest.raises(queue.Empty):
        launcher.next("daemon_started", timeout=1)


def test_peer_server_drops_unauthenticated_frames():
    events: queue.Queue[Any] = queue.Queue()
    server = PeerServer(KEY, lambda *event: events.put(event), bind="127.0.0.1")
    try:
        # A wrong key is refused, and told so: no retry for the hour it may try.
        with pytest.raises(ConnectionError, match="refused this connection's first frame"):
            wire.ChannelClient(f"127.0.0.1:{server.port}", b"y" * 32, timeout=3600)
        assert server.rejected == 1
        good = wire.ChannelClient(f"127.0.0.1:{server.port}", KEY)
        good.send({"type": "member", "index": 3})
        assert events.get(timeout=10)[0::2] == ("peer", {"type": "member", "index": 3})
        good.close()
        assert events.get(timeout=10)[0] == "peer_closed"
        assert events.empty()
    finally:
        server.close()


# -- the guard ----------------------------------------------------------------------------


def _guard(argv: list[str], lifeline: int | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, _SPARKTRAIN_GRACE="1")
    pass_fds: tuple[int, ...] = ()
    if lifeline is not None:
        env[contract.PARENT_FD_ENV] = str(lifeline)
        pass_fds = (lifeline,)
    return subprocess.Popen(
        [sys.executable, "-m", "sparktrain.task.mpi.guard", *argv],
        env=env,
        pass_fds=pass_fds,
        start_new_session=True,
    )


@pytest.mark.parametrize("command, status", [("exit 5", 5), ("kill -KILL $$", 128 + 9)])
def test_guard_exits_with_the_commands_status(command, status):
    assert _guard(["/bin/sh", "-c", command]).wait(timeout=30) == status


def test_guard_stops_its_group_when_the_supervisor_is_gone(tmp_path):
    read_end, write_end = os.pipe()
    pid_file = tmp_path / "child.pid"
    guard = _guard(["/bin/sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], read_end)
    os.close(read_end)
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the child's pid")
    grandchild = int(pid_file.read_text())
    assert alive([grandchild]) == [grandchild]
    os.close(write_end)  # the supervisor died
    guard.wait(timeout=30)
    wait_gone([grandchild], timeout=30)  # a zombie counts as gone: it has exited


# -- the worker under mpirun ------------------------------------------------------------------


def _worker(tmp_path: Path, rank: int, table_ranks: list[int]) -> subprocess.CompletedProcess[str]:
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(dump_call(os.getenv, ("RANK",), {}, 1 << 20))
    table = {r: {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r)} for r in table_ranks}
    env = dict(os.environ)
    env.update(
        {
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": "2",
            contract.MPI_RANK_TABLE_ENV: contract.rank_table(table),
            contract.OUTCOME_DIR_ENV: str(tmp_path),
            contract.PAYLOAD_ENV: str(payload),
            # What mpirun passes on from the supervisor's environment: must not be used.
            contract.PARENT_FD_ENV: "987",
            contract.RESULT_ENV: str(tmp_path / "wrong.pkl"),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "sparktrain.worker"],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        cwd="/",
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_worker_adopts_its_row_of_the_rank_table(tmp_path, rank):
    done = _worker(tmp_path, rank, [0, 1])
    assert done.returncode == 0, done.stderr
    assert int((tmp_path / f"rank-{rank}.pid").read_text()) > 0
    assert not (tmp_path / "wrong.pkl").exists()
    if rank == 0:
        assert load_result((tmp_path / "result.pkl").read_bytes()) == "0"
    else:
        assert not (tmp_path / "result.pkl").exists()


def test_worker_placed_on_the_wrong_host_says_so(tmp_path):
    done = _worker(tmp_path, 1, [0])
    assert done.returncode == 1
    error = json.loads((tmp_path / "error-1.json").read_text())
    assert error["phase"] == "load"
    assert "mpirun started rank 1 on a host that runs ranks [0]" in error["message"]
