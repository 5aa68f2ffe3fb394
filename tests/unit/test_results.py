"""Rank 0's result on its way back: over the channel in pieces, and kept, never lost, when it
cannot be returned (over the limit, the driver gone, a full disk, unloadable on the driver)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparktrain import contract, wire
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.launch.stage import FailedTask, failed_task
from sparktrain.driver.monitor import RunMonitor
from sparktrain.driver.result_intake import ResultReceiver
from sparktrain.driver.result_intake import rank0_result as _rank0_result
from sparktrain.errors import PayloadError, WorkerFailedError, WorkerFailure
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.shipping.payload import KEPT_RESULTS, dump_result, keep_result
from sparktrain.task import result_upload as task_result
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.wire import protocol
from sparktrain.worker import bootstrap
from tests.unit.test_monitor import Done, FakeLaunch, FakeTask


@pytest.fixture
def tmpdir_for_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Kept results go under ``tmp_path`` (tempfile.gettempdir() follows TMPDIR)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / f"sparktrain-{os.getuid()}" / KEPT_RESULTS


def _chunks(data: bytes, size: int = 4) -> list[dict[str, Any]]:
    return [
        protocol.RESULT_CHUNK(index=0, offset=off, blob=data[off : off + size])
        for off in range(0, len(data), size)
    ]


def _end(data: bytes) -> dict[str, Any]:
    return protocol.RESULT_END(index=0, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def test_receiver_assembles_pieces_and_checks_size_and_digest() -> None:
    receiver = ResultReceiver(limit=100)
    data = b"0123456789abcdef!"
    for message in _chunks(data):
        receiver.chunk(message)
    assert receiver.end(_end(data)) is None
    records = [RankOutcome(0, 0, RankStatus.OK, result_sent=len(data))]
    receiver.attach(records)
    assert bytes(records[0].result or b"") == data


@pytest.mark.parametrize(
    "mangle, reason",
    [
        (lambda cs: cs[1:], "a piece at byte 4 came after 0"),
        (lambda cs: cs[:-1], "bytes arrived of"),
        (
            lambda cs: [*cs[:1], {**cs[1], "blob": b"XXXX"}, *cs[2:]],
            "SHA-256 does not match",
        ),
    ],
)
def test_receiver_refuses_a_result_that_is_not_whole(mangle: Any, reason: str) -> None:
    receiver = ResultReceiver(limit=100)
    data = b"0123456789abcdef!"
    for message in mangle(_chunks(data)):
        receiver.chunk(message)
    error = receiver.end(_end(data))
    assert error is not None and reason in error
    assert receiver.results == {}


def test_receiver_refuses_more_than_the_limit_without_holding_it() -> None:
    receiver = ResultReceiver(limit=10)
    data = b"x" * 16
    for message in _chunks(data):
        receiver.chunk(message)
    assert "larger than max_result_bytes (10 bytes)" in (receiver.end(_end(data)) or "")
    assert receiver._parts == {} and receiver.results == {}


def test_receiver_holds_at_most_one_results_worth_across_tasks() -> None:
    receiver = ResultReceiver(limit=20)
    first = b"a" * 16
    for message in _chunks(first):
        receiver.chunk(message)
    assert receiver.end(_end(first)) is None
    other = [{**m, "index": 1} for m in _chunks(b"b" * 8)]
    for message in other:
        receiver.chunk(message)
    end = {**_end(b"b" * 8), "index": 1}
    assert "larger than max_result_bytes" in (receiver.end(end) or "")
    assert list(receiver.results) == [0]


def _job(server: ChannelServer, **settings: Any) -> TaskJob:
    config = RunConfig(np=2, grace_period=1, **settings)
    return TaskJob(
        run_id="resulttest",
        attempt=0,
        config=config.to_json(),
        channel=server.address,
        key=server.key,
        payload=b"",
    )


def test_result_goes_over_the_channel_and_the_record_carries_none(server: ChannelServer) -> None:
    """Real task-side code (TaskSession + deliver) against the real monitor."""
    data = os.urandom(3 * task_result.CHUNK + 17)
    seen: list[RankOutcome] = []

    def body(tasks: list[FakeTask], done: Done) -> None:
        job = _job(server)
        sessions = []
        for task in tasks:
            session = TaskSession(job, task.client)
            task.hello()
            sessions.append(session)
        tasks[0].go.wait(10)
        # The fake task's own listener reads the driver's messages: hand them on.
        threading.Thread(target=_relay, args=(tasks[0], sessions[0]), daemon=True).start()
        record = RankOutcome(0, 0, RankStatus.OK, data)
        seen.extend(task_result.deliver(sessions[0], [record], "h0"))
        for task in tasks:
            task.exited()
        # As the records cross from the tasks: plain dicts.
        done([seen[0].to_json(), RankOutcome(1, 1, RankStatus.OK).to_json()], None)

    mon = RunMonitor(RunConfig(np=2, grace_period=1), server)
    records = mon.watch(FakeLaunch(server, 2, body))
    assert seen[0].result is None and seen[0].result_sent == len(data)
    assert bytes(records[0].result or b"") == data


def _relay(task: FakeTask, session: TaskSession) -> None:
    message = task.received.get(timeout=30)
    session._saved_answer = message
    session._saved.set()


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    with ChannelServer(wire.new_key()) as srv:
        yield srv


class _Unreachable:
    """A TaskSession whose driver connection breaks, or whose driver refuses the result."""

    def __init__(self, answer: str | None, fail_send: bool) -> None:
        self.job = TaskJob(
            run_id="lost",
            attempt=1,
            config=RunConfig(np=1).to_json(),
            channel="",
            key=b"",
            payload=b"",
        )
        self.answer = answer
        self.client = self
        self.fail_send = fail_send
        self.aborted = threading.Event()
        # What the task said of the result it kept (best effort, as TaskSession.send).
        self.said: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        if message["type"] in ("failure", "stack"):
            self.said.append(message)
        elif self.fail_send:
            raise BrokenPipeError(32, "Broken pipe")

    def result_saved(self, timeout: float) -> str | None:
        return self.answer


@pytest.mark.parametrize(
    "answer, fail_send, why",
    [
        (None, True, "sending it failed ([Errno 32] Broken pipe)"),
        (
            "the connection to the driver ended before it confirmed it",
            False,
            "ended before it confirmed it",
        ),
    ],
)
def test_a_result_the_driver_did_not_get_is_kept_on_the_task_host(
    tmpdir_for_kept: Path, answer: str | None, fail_send: bool, why: str
) -> None:
    data = pickle.dumps({"weights": list(range(1000))})
    record = RankOutcome(0, 0, RankStatus.OK, data)
    session: Any = _Unreachable(answer, fail_send)
    (out,) = task_result.deliver(session, [record], "host-a")
    assert out.status is RankStatus.FAILED and out.result is None
    failure = out.failure
    assert isinstance(failure, WorkerFailure)
    kept = tmpdir_for_kept / "lost-attempt2-rank0.pkl"
    assert failure.phase == "result" and failure.host == "host-a"
    assert why in failure.message
    assert f"it is kept in {kept} on host-a" in failure.message
    assert pickle.loads(kept.read_bytes()) == {"weights": list(range(1000))}
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    # Also said over the channel: a cancelled Spark job may never return the record.
    assert [m["type"] for m in session.said] == ["failure"]
    assert session.said[0]["failure"] == failure.to_json()


@pytest.mark.parametrize("when", ["before", "while sending"])
def test_a_result_that_comes_while_the_run_is_stopped_is_kept_and_no_failure(
    tmpdir_for_kept: Path, when: str
) -> None:
    # A rank that saves and returns within its grace period after a timeout's SIGTERM: the
    # driver is stopping the run and takes no result, and the rank did not fail.
    data = pickle.dumps({"weights": [1, 2, 3]})
    record = RankOutcome(0, 0, RankStatus.OK, data)
    session: Any = _Unreachable("the connection to the driver ended before it confirmed it", False)
    if when == "before":
        session.aborted.set()
    else:
        session.send = lambda message: session.aborted.set()  # the stop arrives meanwhile
    (out,) = task_result.deliver(session, [record], "host-a")
    assert out.status is RankStatus.STOPPED and out.result is None
    failure = out.failure
    assert isinstance(failure, WorkerFailure)
    kept = tmpdir_for_kept / "lost-attempt2-rank0.pkl"
    assert failure.phase == "stopped" and failure.host == "host-a"
    assert f"it is kept in {kept} on host-a" in failure.message
    assert pickle.loads(kept.read_bytes()) == {"weights": [1, 2, 3]}


def test_a_result_over_the_limit_is_kept_where_the_error_says(
    tmpdir_for_kept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = tmp_path / "error-0.json"
    monkeypatch.setenv(contract.ERROR_ENV, str(errors))
    monkeypatch.setenv(contract.MAX_RESULT_ENV, str(1 << 20))
    monkeypatch.setenv(contract.RUN_ID_ENV, "big")
    value = b"y" * (2 << 20)
    assert bootstrap._write_result(value, str(tmp_path / contract.RESULT_FILE)) is False
    record = json.loads(errors.read_text())
    kept = tmpdir_for_kept / "big-attempt1-rank0.pkl"
    assert "pickles to 2.0 MiB, over the limit of 1.0 MiB" in record["message"]
    assert f"it is kept in {kept}" in record["message"]
    assert pickle.loads(kept.read_bytes()) == value
    assert not (tmp_path / contract.RESULT_FILE).exists()


def test_a_result_that_cannot_be_written_is_kept_elsewhere(
    tmpdir_for_kept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = tmp_path / "error-0.json"
    monkeypatch.setenv(contract.ERROR_ENV, str(errors))
    monkeypatch.setenv(contract.RUN_ID_ENV, "nodisk")
    target = tmp_path / "gone" / contract.RESULT_FILE  # its folder does not exist
    assert bootstrap._write_result([1, 2, 3], str(target)) is False
    record = json.loads(errors.read_text())
    assert f"could not be written to {target}" in record["message"]
    assert "No such file or directory" in record["message"]
    kept = tmpdir_for_kept / "nodisk-attempt1-rank0.pkl"
    assert pickle.loads(kept.read_bytes()) == [1, 2, 3]


class _LoadsOnlyInRanks:
    """Unpickles only where RANK is set: as a class the driver cannot import would."""

    def __reduce__(self) -> Any:
        return (_rebuild, ())


def _rebuild() -> _LoadsOnlyInRanks:
    if "RANK" not in os.environ:
        raise ModuleNotFoundError("No module named 'only_on_executors'")
    return _LoadsOnlyInRanks()


def test_a_result_the_driver_cannot_load_is_kept_where_the_error_says(
    tmpdir_for_kept: Path,
) -> None:
    data = dump_result(_LoadsOnlyInRanks(), 1 << 20)
    records = [RankOutcome(0, 0, RankStatus.OK, data)]
    with pytest.raises(PayloadError) as info:
        _rank0_result(records, "unloadable-attempt1-rank0")
    kept = tmpdir_for_kept / "unloadable-attempt1-rank0.pkl"
    message = str(info.value)
    assert "cannot be loaded on the driver (ModuleNotFoundError: No module named" in message
    assert f"it is kept in {kept}" in message
    assert kept.read_bytes() == data


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a disk that fills up for real."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_keep_result_on_a_full_disk_raises_and_leaves_no_partial_file(full_disk: Path) -> None:
    with pytest.raises(OSError, match="No space left on device"):
        keep_result(b"z" * (1 << 20), "x", folder=str(full_disk))
    assert list((full_disk / f"sparktrain-{os.getuid()}" / KEPT_RESULTS).iterdir()) == []


def test_a_result_that_fills_the_disk_is_kept_elsewhere(
    full_disk: Path, tmpdir_for_kept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = tmp_path / "error-0.json"
    monkeypatch.setenv(contract.ERROR_ENV, str(errors))
    monkeypatch.setenv(contract.RUN_ID_ENV, "full")
    value = os.urandom(1 << 20)
    target = full_disk / contract.RESULT_FILE
    assert bootstrap._write_result(value, str(target)) is False
    record = json.loads(errors.read_text())
    assert f"rank 0's result (1.0 MiB) could not be written to {target}" in record["message"]
    assert "No space left on device" in record["message"]
    assert list(full_disk.iterdir()) == []  # no half-written result.pkl(.tmp)
    kept = tmpdir_for_kept / "full-attempt1-rank0.pkl"
    assert pickle.loads(kept.read_bytes()) == value


SPARK_OOM = (
    "An error occurred while calling o61.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (192.0.2.2 "
    "executor 1): java.lang.OutOfMemoryError: Java heap space\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:1)"
)


def test_the_failed_spark_task_is_read_from_the_job_error() -> None:
    assert failed_task(Exception(SPARK_OOM)) == FailedTask(
        0, "192.0.2.2", "1", "java.lang.OutOfMemoryError: Java heap space"
    )
    assert failed_task(Exception("Job 3 cancelled part of cancelled job group x")) is None


def test_a_failed_spark_job_names_the_task_host_and_executor_not_rank_minus_one(
    server: ChannelServer,
) -> None:
    from sparktrain.driver.launch.stage import describe_spark_error

    class SparkLike(FakeLaunch):
        def failed_task(self, error: BaseException) -> FailedTask | None:
            return failed_task(error)

        def describe_error(self, error: BaseException) -> str:
            return describe_spark_error(error)

    def body(tasks: list[FakeTask], done: Done) -> None:
        for task in tasks:
            task.hello()
        for i, task in enumerate(tasks):
            task.started(i)
        done(None, Exception(SPARK_OOM))

    mon = RunMonitor(RunConfig(np=2, grace_period=1), server)
    with pytest.raises(WorkerFailedError) as info:
        mon.watch(SparkLike(server, 2, body))
    text = str(info.value)
    assert "rank -1" not in text
    assert (
        "rank 0 on 127.0.0.1 was lost: its Spark task 0 on executor 1 failed: "
        "java.lang.OutOfMemoryError: Java heap space"
    ) in text


def test_a_launch_error_naming_no_task_reads_as_the_job_failing() -> None:
    failure = WorkerFailure(rank=-1, phase="lost", message="the Spark job failed: boom")
    assert failure.describe().splitlines()[0] == "the Spark job failed: boom"
