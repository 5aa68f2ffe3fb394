"""RunMonitor and LocalLaunch without Spark: deadlines, failures, interrupts, bad messages.

The tasks here are threads that speak the real protocol to a real ChannelServer (the monitor
cannot tell them from Spark tasks); LocalLaunch runs real worker processes.
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from sparktrain import wire
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.launch.local import LocalLaunch
from sparktrain.driver.monitor import RunMonitor
from sparktrain.driver.restarts import restartable
from sparktrain.errors import (
    RendezvousTimeoutError,
    RunTimeoutError,
    WorkerFailedError,
    WorkerFailure,
)
from sparktrain.layout.cluster import TaskInfo
from sparktrain.rank_outcome import RankStatus
from sparktrain.shipping.payload import dump_call
from sparktrain.task.assignment import TaskJob
from sparktrain.wire import protocol
from tests.helpers import wait_for

Done = Callable[[list[dict[str, Any]] | None, BaseException | None], None]


class FakeTask:
    """One task: connects, says hello, and does what the test scripts."""

    def __init__(self, server: ChannelServer, index: int) -> None:
        self.index = index
        self.client = wire.ChannelClient(server.address, server.key, timeout=5)
        self.aborted = threading.Event()
        self.go = threading.Event()
        self.abort_reason = ""
        # The driver's other messages (show_stacks), in order.
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()

    def hello(self) -> None:
        info = json.loads(TaskInfo(index=self.index, host="127.0.0.1", port=0).to_json())
        self.client.send(protocol.HELLO(index=self.index, info=info))
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        try:
            while True:
                message = self.client.receive()
                if message.get("type") == "go":
                    self.go.set()
                if message.get("type") == "abort":
                    self.abort_reason = message["reason"]
                    self.aborted.set()
                elif message.get("type") != "go":
                    self.received.put(message)
        except (OSError, EOFError, wire.FrameError):
            pass

    def started(self, rank: int) -> None:
        """A rank's process started: as a real task, only once the driver said "go"."""
        assert self.go.wait(10)
        self.client.send(protocol.STARTED(rank=rank, pid=os.getpid(), host="h", index=self.index))

    def exited(self) -> None:
        self.client.send(protocol.EXITED(index=self.index))


class FakeLaunch:
    """A launch whose tasks are scripted by ``body(tasks, done)`` in a thread."""

    def __init__(self, server: ChannelServer, n: int, body: Callable[[list[FakeTask], Done], None]):
        self.server = server
        self.n = n
        self.body = body
        self.cancelled = threading.Event()
        self.tasks: list[FakeTask] = []
        self._done: Done | None = None
        self._lock = threading.Lock()

    def start(self, done: Done) -> None:
        self._done = done
        self.tasks = [FakeTask(self.server, i) for i in range(self.n)]
        threading.Thread(target=self.body, args=(self.tasks, self.finish), daemon=True).start()

    def finish(self, records: list[dict[str, Any]] | None, error: BaseException | None) -> None:
        with self._lock:
            done, self._done = self._done, None
        if done is not None:
            done(records, error)

    def cancel(self) -> None:
        self.cancelled.set()
        self.finish(None, None)

    def failed_task(self, error: BaseException) -> None:
        return None

    def describe_error(self, error: BaseException) -> str:
        return f"launch failed: {error}"


def ok_records(n: int) -> list[dict[str, Any]]:
    return [{"index": i, "rank": i, "status": "ok", "result": None} for i in range(n)]


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    with ChannelServer(wire.new_key()) as srv:
        yield srv


def monitor(server: ChannelServer, **settings: Any) -> tuple[RunMonitor, io.StringIO]:
    out = io.StringIO()
    config = RunConfig(np=2, grace_period=1, **settings)
    return RunMonitor(config, server, out=out), out


def test_malformed_messages_are_dropped_and_counted_and_the_run_goes_on(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        bad = tasks[0].client
        bad.send({"type": "started"})  # no rank
        bad.send({"type": "log", "rank": "zero", "line": 5})
        bad.send({"type": "hello", "index": 99, "info": {}})  # no such task
        bad.send({"type": "failure", "failure": {"rank": "x", "time": "late"}})
        bad.send({"type": "who knows"})
        tasks[1].client.send(protocol.LOG(rank=1, line="a real line"))
        for i, task in enumerate(tasks):
            task.started(i)
            task.exited()
        done(ok_records(2), None)

    mon, out = monitor(server)
    records = mon.watch(FakeLaunch(server, 2, body))
    assert [r.status for r in records] == [RankStatus.OK, RankStatus.OK]
    assert mon.malformed == 5
    assert list(mon.phases()) == ["submit", "rendezvous", "training", "teardown"]
    assert "[rank 1] a real line" in out.getvalue()


def test_rendezvous_timeout_names_the_missing_task(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        tasks[0].hello()  # task 1 never arrives

    launch = FakeLaunch(server, 2, body)
    mon, _ = monitor(server, start_timeout=0.5)
    with pytest.raises(RendezvousTimeoutError, match=r"ranks \[1\] never reached") as info:
        mon.watch(launch)
    assert info.value.missing == [1]
    assert launch.cancelled.is_set()
    # Task 0 was told why it is being stopped.
    assert launch.tasks[0].aborted.wait(5)
    assert "never reached the rendezvous" in launch.tasks[0].abort_reason


def test_a_failed_rank_stops_the_one_blocked_in_a_collective(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        failure = WorkerFailure(rank=0, host="h", exc_type="ValueError", message="bad", time=1.0)
        tasks[0].client.send(protocol.FAILURE(failure=failure.to_json()))
        tasks[0].exited()
        # Task 1 is blocked until the driver tells it to stop; then its ranks go.
        assert tasks[1].aborted.wait(10)
        confirmed.set()
        tasks[1].exited()

    confirmed = threading.Event()
    launch = FakeLaunch(server, 2, body)
    # A grace period of an hour: only task 1's confirmation can end the wait in time.
    mon = RunMonitor(RunConfig(np=2, grace_period=3600), server, out=io.StringIO())
    outcome: queue.Queue[BaseException | None] = queue.Queue()

    def watch() -> None:
        try:
            mon.watch(launch)
            outcome.put(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.put(error)

    threading.Thread(target=watch, daemon=True).start()
    error = outcome.get(timeout=60)
    assert isinstance(error, WorkerFailedError)
    assert error.root_cause.rank == 0
    assert "ValueError: bad" in str(error) or "raised ValueError" in str(error)
    # Stopped on task 1's confirmation: cancelled after it, long before any grace ran out.
    assert confirmed.is_set() and launch.tasks[1].aborted.is_set() and launch.cancelled.is_set()


def test_a_task_that_vanishes_after_its_peer_lost_it_is_the_root_cause(server) -> None:
    # Task 1's executor is killed: rank 0's all_reduce fails at once, and its failure can
    # reach the driver before task 1's connection closes. The vanished task is still the
    # cause, and the run restartable: rank 0's error only followed it.
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        failure = WorkerFailure(
            rank=0,
            host="h",
            exc_type="RuntimeError",
            message="[pair.cc:553] Connection closed by peer [10.0.0.2]:53396",
            time=1.0,
            user_error=True,
        )
        tasks[0].client.send(protocol.FAILURE(failure=failure.to_json()))
        assert tasks[1].aborted.wait(10)  # the driver is stopping the run for rank 0's error
        tasks[1].client.close()  # then task 1's process is gone, without a word
        tasks[0].exited()

    launch = FakeLaunch(server, 2, body)
    mon, _ = monitor(server)
    with pytest.raises(WorkerFailedError) as info:
        mon.watch(launch)
    root = info.value.root_cause
    assert (root.rank, root.phase) == (1, "lost")
    assert "its Spark task vanished" in str(info.value)
    assert "Connection closed by peer" in str(info.value)  # rank 0, among the others
    assert restartable(info.value, mon.config)


def test_run_timeout_stops_every_rank(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        for task in tasks:
            assert task.aborted.wait(10)
            task.exited()

    launch = FakeLaunch(server, 2, body)
    mon, _ = monitor(server, timeout=0.5)
    with pytest.raises(RunTimeoutError, match="timeout=0.5s"):
        mon.watch(launch)
    assert all(t.aborted.is_set() for t in launch.tasks)


def _interrupted_run(
    server, press: Callable[[threading.Event], None], **settings: Any
) -> list[int]:
    """Watch a run of two started ranks while ``press`` (on its own thread, given the event
    set once both started) sends Ctrl-C; return the ranks that confirmed their stop before
    the KeyboardInterrupt reached the caller."""
    started = threading.Event()
    confirmed: list[int] = []

    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        started.set()
        for task in tasks:
            assert task.aborted.wait(10)
            confirmed.append(task.index)
            task.exited()

    launch = FakeLaunch(server, 2, body)
    mon, _ = monitor(server, **settings)
    threading.Thread(target=press, args=(started,), daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        mon.watch(launch)
    return confirmed


def test_ctrl_c_stops_every_rank_before_it_is_raised(server, caplog) -> None:
    def press_ctrl_c(started: threading.Event) -> None:
        started.wait(10)
        # A real SIGINT, as a terminal sends: it wakes the monitor blocked on its queue.
        os.kill(os.getpid(), signal.SIGINT)

    confirmed = _interrupted_run(server, press_ctrl_c)
    assert sorted(confirmed) == [0, 1]  # both had confirmed before run() gave up control
    assert "interrupted; stopping every rank" in caplog.text


def test_ctrl_c_taken_by_another_thread_still_stops_every_rank(server, caplog) -> None:
    # The kernel may hand a process-directed SIGINT to any thread; one that lands on another
    # thread does not wake a main thread blocked on a lock. Deliver it to a helper thread on
    # purpose: the run must still stop (not wait for its hour-long deadline).
    def main_thread_waits() -> bool:
        # Blocked in the kernel on the queue's lock, with nothing left to wake it.
        tid = threading.main_thread().native_id
        with open(f"/proc/self/task/{tid}/wchan") as f:
            return "futex" in f.read()

    def press_ctrl_c_on_this_thread(started: threading.Event) -> None:
        started.wait(10)
        wait_for(main_thread_waits, 10, "the monitor to wait on its queue")
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    confirmed = _interrupted_run(server, press_ctrl_c_on_this_thread, timeout=3600)
    assert sorted(confirmed) == [0, 1]
    assert "interrupted; stopping every rank" in caplog.text


# -- LocalLaunch: real worker processes -----------------------------------------------------


def _job(fn: Callable[..., Any], *args: Any, channel: str, key: bytes, **settings: Any) -> TaskJob:
    config = RunConfig(np=-2, grace_period=1, **settings)
    return TaskJob(
        run_id="monitortest",
        attempt=0,
        config=config.to_json(),
        channel=channel,
        key=key,
        payload=dump_call(fn, args, {}, 1 << 20),
    )


def _rank1_fails_rank0_naps(seconds: float) -> None:
    import os

    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 gave up")
    time.sleep(seconds)


def test_local_launch_one_rank_fails_while_the_other_blocks(server) -> None:
    job = _job(_rank1_fails_rank0_naps, 120, channel=server.address, key=server.key)
    mon = RunMonitor(job.run_config, server, out=io.StringIO())
    with pytest.raises(WorkerFailedError) as info:
        mon.watch(LocalLaunch(job))
    assert info.value.root_cause.rank == 1
    assert "RuntimeError" in str(info.value) and "rank 1 gave up" in str(info.value)
    assert "rank 0 on 127.0.0.1 was still running" in str(info.value)  # stopped in its nap
    pids = [m["pid"] for m in mon.started.values()]
    assert len(pids) == 2
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_local_launch_reports_its_end_exactly_once() -> None:
    calls: list[tuple[Any, Any]] = []
    job = TaskJob(
        run_id="x", attempt=0, config=RunConfig(np=-1).to_json(), channel="", key=b"", payload=b""
    )
    launch = LocalLaunch(job)
    launch._done = lambda records, error: calls.append((records, error))
    launch.cancel()
    launch.cancel()
    launch._finish([{"rank": 0}], None)  # the supervisor ending later changes nothing
    assert calls == [(None, None)]
