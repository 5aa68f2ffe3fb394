"""RunMonitor and the stopped ranks' stacks, with scripted tasks (no processes).

The tasks are the threads of ``test_monitor``: they speak the real protocol to a real
ChannelServer.
"""

from __future__ import annotations

import pytest

from sparktrain.errors import RunTimeoutError, WorkerFailure
from sparktrain.wire import protocol
from tests.unit.test_monitor import Done, FakeLaunch, FakeTask, monitor, server

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
