"""A rank that finished while another failed: its result, already on its way to the driver as
the run is being stopped, is collected and kept, and the error still ends with the root cause."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from sparktrain import wire
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.errors import WorkerFailedError, WorkerFailure
from sparktrain.shipping.payload import load_kept
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.wire import protocol


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The driver and its ranks keep their files under ``tmp_path``, not the real /tmp."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_result_on_its_way_as_a_peer_fails_is_kept_and_the_cause_comes_last(
    private_tmp: Path,
) -> None:
    from sparktrain import SparkRunner
    from tests.fixtures import trainers

    folder = private_tmp / "handshake"
    folder.mkdir()
    # Rank 1 fails only once rank 0's process has ended: rank 1's failure reaches the driver
    # (which then stops the run) before rank 0's result, on the same connection, every time.
    with pytest.raises(WorkerFailedError) as err:
        SparkRunner(np=-2, progress=False).run_all(trainers.finishes_as_its_peer_fails, str(folder))
    error = err.value
    message = str(error)
    assert error.root_cause.rank == 1, message
    assert set(error.failures) == {1} and 0 not in error.stopped, message
    assert message.splitlines()[-1] == "ValueError: rank 1 could not find its data", message
    # Rank 0's value reached the driver, which keeps it, as the error says.
    (path,) = re.findall(r"rank 0's: it is kept in (\S+\.pkl)", message)
    assert load_kept(path) == {"weights": [1, 2, 3]}
    assert Path(path).is_relative_to(private_tmp)
    assert "did not reach the driver" not in message


def _job() -> TaskJob:
    return TaskJob(
        run_id="abort",
        attempt=0,
        config=RunConfig(np=1).to_json(),
        channel="",
        key=b"",
        payload=b"",
    )


def test_a_task_still_hears_the_drivers_answer_to_its_result_after_an_abort() -> None:
    key = wire.new_key()
    with ChannelServer(key) as server:
        client = wire.ChannelClient(server.address, key, timeout=30)
        session = TaskSession(_job(), client)
        session.listen()
        session.send(protocol.HELLO(index=0, info={}))
        conn_id, _ = server.events.get(timeout=30)
        # The driver stops the run, then answers the result that was on its way.
        server.send(conn_id, protocol.ABORT(reason="rank 1 failed"))
        kind, _, reason = session.events.get(timeout=30)
        assert (kind, reason) == ("abort", "rank 1 failed")
        assert session.aborted.is_set()
        server.send(conn_id, protocol.RESULT_SAVED(ok=True, error=""))
        assert session.result_saved(30) is None
        # A connection that ends leaves no answer, at once.
        server.close()
        answered: list[Any] = []
        waiter = threading.Thread(target=lambda: answered.append(session.result_saved(3600)))
        waiter.start()
        waiter.join(30)
        assert answered == ["the connection to the driver ended before it confirmed it"]
        client.close()


def test_the_error_ends_with_the_root_cause_when_other_ranks_follow_it() -> None:
    cause = WorkerFailure(
        rank=1,
        host="h1",
        exit_code=1,
        phase="run",
        time=1.0,
        user_error=True,
        traceback='Traceback (most recent call last):\n  File "t.py", line 3\nValueError: no data\n',
    )
    later = WorkerFailure(rank=2, host="h2", exit_code=1, phase="run", time=2.0, message="bye")
    stopped = WorkerFailure(rank=0, host="h0", phase="stopped", time=3.0, message="kept in x.pkl")
    text = str(WorkerFailedError({1: cause, 2: later}, stopped={0: stopped}))
    lines = text.splitlines()
    assert lines[0] == "2 rank(s) failed. Root cause:"
    assert lines[2].startswith("rank 1 on h1 ")
    assert lines[-2] == f"Root cause, as above: {lines[2]}"
    assert lines[-1] == "ValueError: no data"
    assert text.index("rank 2 on h2") < text.index("kept in x.pkl") < text.index(lines[-2])
    # Alone, it is not repeated.
    alone = str(WorkerFailedError({1: cause})).splitlines()
    assert alone[-1] == "ValueError: no data" and not any("as above" in line for line in alone)
