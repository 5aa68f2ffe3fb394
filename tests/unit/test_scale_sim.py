"""The real driver (attempt loop, monitor, channel, interface vote, result, teardown) against
more simulated tasks than the channel used to admit, over real sockets."""

from __future__ import annotations

import threading

import pytest

from sparktrain import SparkRunner
from sparktrain.driver.channel import ChannelServer
from sparktrain.errors import WorkerFailedError
from tests.fixtures.simtasks import RESULT, simulated

N = 320  # over the 256 authenticated connections the channel once held


def _never_runs() -> None:
    raise AssertionError("the simulated tasks run no function")


def _runner(channels: list[ChannelServer]) -> SparkRunner:
    runner = SparkRunner(np=-N, start_timeout=120, stall_timeout=None, grace_period=5)
    runner._channel_hook = channels.append
    return runner


@pytest.mark.parametrize("interfaces", [1, 3])
def test_every_task_gets_go_and_the_result_comes_back(interfaces: int) -> None:
    threads = threading.active_count()
    channels: list[ChannelServer] = []
    with simulated(N, helpers=2, interfaces=interfaces) as launches:
        assert _runner(channels).run(_never_runs) == RESULT
    (launch,) = launches
    launch.join()
    assert launch.errors == []
    assert launch.total("go_count") == N
    assert launch.alive() == 0
    # Teardown leaves nothing: no connection, no thread of the channel's, no helper.
    (channel,) = channels
    assert not channel._conns
    assert not channel._thread.is_alive()
    assert threading.active_count() <= threads + 1  # the launch's own waiter may be ending


def test_a_failure_stops_every_task() -> None:
    channels: list[ChannelServer] = []
    with simulated(N, helpers=2, mode="fail", fail_index=N - 3) as launches:
        with pytest.raises(WorkerFailedError, match="simulated failure") as caught:
            _runner(channels).run(_never_runs)
    assert list(caught.value.failures) == [N - 3]
    (launch,) = launches
    launch.join()
    # Every other task was told to stop (the failed one too), and said it had.
    assert launch.total("aborted_count") == N
    assert not channels[0]._conns
