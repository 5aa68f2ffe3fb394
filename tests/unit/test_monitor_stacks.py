"""RunMonitor's stall watch and the stopped ranks' stacks, with scripted tasks (no processes).

The tasks are the threads of ``test_monitor``: they speak the real protocol to a real
ChannelServer.
"""

from __future__ import annotations

import logging
import os

import pytest

from sparktrain.driver.stall import StallWatch
from sparktrain.errors import RunHungError, RunStalledError, RunTimeoutError, WorkerFailure
from sparktrain.rank_outcome import RankStatus
from sparktrain.wire import protocol
from tests.unit.test_monitor import Done, FakeLaunch, FakeTask, monitor, ok_records, server

__all__ = ["server"]  # the fixture, used by name


def stack(rank: int, where: str, stopped: bool) -> dict[str, object]:
    record = WorkerFailure(
        rank=rank,
        host="h",
        phase="stopped" if stopped else "running",
        where=where,
        stack=f'  File "/job/train.py", line {rank}, in train',
    )
    return protocol.STACK(record=record.to_json(), stopped=stopped)


def test_the_stall_watch_fires_once_per_silence() -> None:
    from sparktrain.config import RunConfig

    watch = StallWatch(RunConfig(np=1, stall_timeout=10))
    assert watch.deadline() is None  # the ranks are not running yet
    watch.activity(5.0)
    assert watch.deadline() is None
    watch.start(100.0)
    assert watch.deadline() == 110.0 and not watch.stalled(109.9)
    assert watch.stalled(110.0) and not watch.stalled(200.0)  # once
    assert watch.deadline() is None
    watch.activity(300.0)  # a sign of life: the next silence counts from here
    assert watch.deadline() == 310.0 and watch.stalled(315.0)
    assert StallWatch(RunConfig(np=1, stall_timeout="off")).deadline() is None


def test_a_stall_shows_every_ranks_stack_once_per_silence(server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sparktrain")

    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        for _ in range(2):  # two silences, with a line in between
            for i, task in enumerate(tasks):
                message = task.received.get(timeout=10)
                assert message["type"] == "show_stacks"
                task.client.send(stack(i, f"in train at train.py:{i}", stopped=False))
            tasks[0].client.send(protocol.LOG(rank=0, line="alive again"))
        for task in tasks:
            task.exited()
        done(ok_records(2), None)

    mon, out = monitor(server, stall_timeout=0.5)
    launch = FakeLaunch(server, 2, body)
    records = mon.watch(launch)
    assert [r.status for r in records] == [RankStatus.OK, RankStatus.OK]
    # Each silence asked every rank once: no request left over in any task's queue.
    for task in launch.tasks:
        left = [task.received.get_nowait() for _ in range(task.received.qsize())]
        assert [m for m in left if m["type"] == "show_stacks"] == []
    shown = [r.getMessage().splitlines()[0] for r in caplog.records]
    assert shown.count("rank 0 on h is running: in train at train.py:0") == 2
    assert shown.count("rank 1 on h is running: in train at train.py:1") == 2
    assert sum("no rank has printed or reported anything for 500ms" in m for m in shown) == 2
    assert "[rank 0] alive again" in out.getvalue()


def test_stall_action_fail_stops_the_run_with_the_stacks(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        for i, task in enumerate(tasks):
            assert task.aborted.wait(10)
            task.client.send(stack(i, f"in train at train.py:{i}", stopped=True))
            task.exited()

    mon, _ = monitor(server, stall_timeout=0.5, stall_action="fail")
    with pytest.raises(RunStalledError) as info:
        mon.watch(FakeLaunch(server, 2, body))
    assert "stall_action is 'fail'" in str(info.value)
    assert "  rank 1: in train at train.py:1" in str(info.value)


def test_a_rank_that_only_lost_its_peer_to_the_stop_does_not_hide_the_timeout(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        assert tasks[0].aborted.wait(10) and tasks[1].aborted.wait(10)
        tasks[0].client.send(stack(0, "in train at train.py:0", stopped=True))
        tasks[0].exited()
        # Task 1's rank left its collective when rank 0 was stopped, before its own stop.
        lost = WorkerFailure(
            rank=1, exc_type="DistBackendError", message="Connection closed by peer", time=9.0
        )
        tasks[1].client.send(protocol.FAILURE(failure=lost.to_json()))
        tasks[1].exited()

    mon, _ = monitor(server, timeout=0.5)
    with pytest.raises(RunTimeoutError) as info:
        mon.watch(FakeLaunch(server, 2, body))
    assert str(info.value).startswith("the run exceeded timeout=0.5s")
    assert set(info.value.stopped) == {0, 1}
    assert "  rank 1: Connection closed by peer" in str(info.value).splitlines()


def test_a_hang_is_named_once_with_its_error_and_no_stall_warning_before_it(server) -> None:
    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        tasks[0].client.send(protocol.COLLECTIVES(counts=[[0, 1, 0]]))  # rank 0 waits
        tasks[1].client.send(protocol.COLLECTIVES(counts=[[1, 0, 0]]))  # rank 1 never comes
        for i, task in enumerate(tasks):
            assert task.aborted.wait(10)
            task.client.send(stack(i, f"in train at train.py:{i}", stopped=True))
            task.exited()

    mon, _ = monitor(server, stall_timeout=0.5)
    launch = FakeLaunch(server, 2, body)
    with pytest.raises(RunHungError) as info:
        mon.watch(launch)
    message = str(info.value)
    assert message.startswith(
        f"the run hung: rank 1 (host h, pid {os.getpid()}; outside any collective, 0 done) "
        f"is behind, while rank 0 (host h, pid {os.getpid()}; waiting in collective #1) waited"
    )
    assert "  rank 1: in train at train.py:1" in message.splitlines()
    # The silence watch waited for the hang watch: no rank was asked for its stack before.
    for task in launch.tasks:
        left = [task.received.get_nowait() for _ in range(task.received.qsize())]
        assert [m["type"] for m in left if m["type"] == "show_stacks"] == []
