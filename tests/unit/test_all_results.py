"""Every rank's result (``run_all``): the driver's receiver holds at most ``max_result_bytes``
in total, however many ranks send at once; the list comes back by rank; what does not fit is
kept (on its host, and what arrived on the driver) and the error names every file."""

from __future__ import annotations

import hashlib
import os
import pickle
import queue
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from sparktrain import wire
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.monitor import RunMonitor
from sparktrain.driver.result_intake import ResultReceiver, all_results
from sparktrain.errors import PayloadError, WorkerFailedError
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.shipping.payload import dump_result, load_kept
from sparktrain.task import result_upload as task_result
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.wire import protocol
from tests.unit.test_monitor import Done, FakeLaunch, FakeTask


@pytest.fixture
def kept_under_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Kept results go under ``tmp_path`` (tempfile.gettempdir() follows TMPDIR)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _pieces(index: int, data: bytes, size: int = 4) -> list[dict[str, Any]]:
    return [
        protocol.RESULT_CHUNK(index=index, offset=off, blob=data[off : off + size])
        for off in range(0, len(data), size)
    ]


def _end(index: int, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    return protocol.RESULT_END(index=index, size=len(data), sha256=digest)


def test_the_limit_is_on_the_total_and_never_passed_while_ranks_send_at_once() -> None:
    receiver = ResultReceiver(limit=100, all_ranks=True)
    sent = {0: b"a" * 40, 1: b"b" * 40, 2: b"c" * 40}
    streams = {index: _pieces(index, data) for index, data in sent.items()}
    # Interleaved, as three tasks sending together: never more than the limit held.
    for step in range(10):
        for index in sent:
            receiver.chunk(streams[index][step])
            held = sum(map(len, receiver._parts.values())) + sum(
                map(len, receiver.results.values())
            )
            assert held <= 100 and held == receiver._held
    answers = {index: receiver.end(_end(index, data)) for index, data in sent.items()}
    # The piece that would have passed the limit was refused (rank 1's 9th: 100 bytes were
    # held), and what it held let go; the two others, which fit together, were taken whole.
    assert answers[0] is None and answers[2] is None
    assert answers[1] == "the ranks' results together are larger than max_result_bytes (100 bytes)"
    assert {i: bytes(d) for i, d in receiver.results.items()} == {0: sent[0], 2: sent[2]}


def test_a_refused_result_frees_what_it_held_for_the_others() -> None:
    receiver = ResultReceiver(limit=18, all_ranks=True)
    for message in _pieces(0, b"a" * 12)[:2]:
        receiver.chunk(message)  # 8 bytes of rank 0's, still coming
    for message in _pieces(1, b"b" * 12):
        receiver.chunk(message)  # 8 + 12 passes 18: rank 1's is refused and let go
    assert receiver.end(_end(1, b"b" * 12)) is not None
    for message in _pieces(0, b"a" * 12)[2:]:
        receiver.chunk(message)
    assert receiver.end(_end(0, b"a" * 12)) is None
    assert receiver._held == 12


def _records(values: dict[int, Any]) -> list[RankOutcome]:
    return [
        RankOutcome(10 + rank, rank, RankStatus.OK, dump_result(v, 1 << 20, rank))
        for rank, v in values.items()
    ]


def test_values_come_back_as_a_list_by_rank_with_none_for_a_rank_that_returned_nothing() -> None:
    records = _records({2: "two", 0: {"zero": 0}, 1: None})
    assert all_results(records, 3, "r-attempt1-rank0") == [{"zero": 0}, None, "two"]


def test_missing_ranks_are_named() -> None:
    records = _records({0: 0, 3: 3})
    records.append(RankOutcome(11, 1, RankStatus.OK))
    with pytest.raises(PayloadError, match=r"rank\(s\) 2 did not reach the driver"):
        all_results(records, 4, "r-attempt1-rank0")
    with pytest.raises(PayloadError, match="rank 1 finished but its result did not reach"):
        all_results([*records, _records({2: 2})[0]], 4, "r-attempt1-rank0")


def test_a_value_that_does_not_unpickle_on_the_driver_is_kept_naming_its_rank(
    kept_under_tmp: Path,
) -> None:
    records = _records({0: 0})
    broken = b"\x80\x05\x95not a pickle"
    records.append(RankOutcome(11, 1, RankStatus.OK, broken))
    with pytest.raises(PayloadError, match="rank 1's result arrived but cannot be loaded") as err:
        all_results(records, 2, "r-attempt1-rank0")
    kept = kept_under_tmp / f"sparktrain-{os.getuid()}" / "results" / "r-attempt1-rank1.pkl"
    assert f"it is kept in {kept}" in str(err.value)
    assert kept.read_bytes() == broken


def _relay(task: FakeTask, session: TaskSession) -> None:
    """Hand the driver's answers, which the fake task's own listener reads, to the session."""
    while True:
        try:
            message = task.received.get(timeout=30)
        except queue.Empty:
            return
        if message["type"] == "result_saved":
            session._saved_answer = message
            session._saved.set()


def test_results_over_the_total_are_kept_where_they_are_and_the_error_names_every_file(
    kept_under_tmp: Path,
) -> None:
    """Real task-side code (TaskSession + deliver) against the real monitor: one connection
    sends three ranks' results one after another (as the local supervisor, or a task with
    several GPUs, does); the third does not fit within the total."""
    values = {rank: bytes([65 + rank]) * 3000 for rank in range(3)}
    pickles = {rank: dump_result(v, 1 << 20, rank) for rank, v in values.items()}
    limit = len(pickles[0]) + len(pickles[1]) + 100
    config = RunConfig(np=3, grace_period=1, max_result_bytes=limit)
    with ChannelServer(wire.new_key()) as server:
        job = TaskJob("alltest", 0, config.to_json(), server.address, server.key, b"")
        out: list[RankOutcome] = []

        def body(tasks: list[FakeTask], done: Done) -> None:
            for task in tasks:
                task.hello()
            session = TaskSession(job, tasks[0].client)
            assert tasks[0].go.wait(10)
            threading.Thread(target=_relay, args=(tasks[0], session), daemon=True).start()
            records = [RankOutcome(r, r, RankStatus.OK, pickles[r]) for r in range(3)]
            out.extend(task_result.deliver(session, records, "host-a"))
            for task in tasks:
                task.exited()
            done([r.to_json() for r in out], None)

        monitor = RunMonitor(config, server, kept_name="alltest-attempt1-rank0")
        with pytest.raises(WorkerFailedError) as err:
            monitor.watch(FakeLaunch(server, 3, body))
    message = str(err.value)
    assert [r.status for r in out] == [RankStatus.OK, RankStatus.OK, RankStatus.FAILED]
    assert err.value.root_cause.rank == 2 and err.value.root_cause.phase == "result"
    assert f"max_result_bytes ({limit} bytes)" in message
    # Every file is named and gives its value back: rank 2's kept by its task (on host-a),
    # ranks 0 and 1's by the driver, which had them when the run failed.
    paths = dict(re.findall(r"rank (\d)'s: it is kept in (\S+\.pkl)", message))
    paths["2"] = re.search(r"it is kept in (\S+rank2\.pkl) on host-a", message).group(1)
    assert sorted(paths) == ["0", "1", "2"]
    for rank, path in paths.items():
        assert Path(path).name == f"alltest-attempt1-rank{rank}.pkl"
        assert load_kept(path) == values[int(rank)]
    assert monitor.results.results == {} and monitor.results._held == 0
    assert pickle.loads(pickles[0]) == values[0]


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The driver and its ranks keep their files under ``tmp_path``, not the real /tmp."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_run_all_on_the_driver_returns_every_rank_by_rank(private_tmp: Path) -> None:
    from sparktrain import SparkRunner
    from tests.fixtures import trainers

    runner = SparkRunner(np=-2, progress=False)
    placed = runner.run_all(trainers.placed)
    assert [(rank, local) for rank, local, _ in placed] == [(0, 0), (1, 1)]
    assert len({pid for _, _, pid in placed}) == 2 and os.getpid() not in placed[0]
    values = runner.run_all(trainers.sized_results, {0: 3})
    assert len(values) == 2 and len(values[0]) == 3 and values[1] is None  # returned nothing
    assert runner.run(trainers.placed)[:2] == (0, 0)  # run() still gives rank 0's alone


def test_run_all_on_the_driver_keeps_what_does_not_fit_in_the_total(private_tmp: Path) -> None:
    from sparktrain import SparkRunner
    from tests.fixtures import trainers

    limit = 300_000
    runner = SparkRunner(np=-2, progress=False, max_result_bytes=limit)
    with pytest.raises(WorkerFailedError) as err:
        runner.run_all(trainers.sized_results, {0: 200_000, 1: 200_000})
    message = str(err.value)
    # Rank 0's went first and fit; rank 1's would have passed the limit: kept by the local
    # supervisor on this host, rank 0's by the driver. Both files give the values back.
    assert (
        "rank 1 finished, but its result (0.2 MiB) did not reach the driver: the ranks' "
        f"results together are larger than max_result_bytes ({limit} bytes)"
    ) in message
    paths = re.findall(r"it is kept in (\S+\.pkl)", message)
    assert sorted(Path(p).name.rsplit("-", 1)[1] for p in set(paths)) == ["rank0.pkl", "rank1.pkl"]
    assert sorted(len(load_kept(p)) for p in set(paths)) == [200_000, 200_000]
    assert all(Path(p).is_relative_to(private_tmp) for p in paths)


def test_run_all_names_the_rank_whose_value_cannot_be_pickled(private_tmp: Path) -> None:
    from sparktrain import SparkRunner
    from tests.fixtures import trainers

    with pytest.raises(WorkerFailedError) as err:
        SparkRunner(np=-2, progress=False).run_all(trainers.lock_on, 1)
    assert err.value.root_cause.rank == 1 and err.value.root_cause.phase == "result"
    assert "rank 1 returned a _thread.lock that cannot be pickled" in str(err.value)


def test_values_that_came_with_the_job_are_held_to_the_total_and_kept(
    kept_under_tmp: Path,
) -> None:
    # A detached Connect run: each rank's value came in its task's row, each within the
    # limit by itself, together over it.
    records = _records({0: b"a" * 600, 1: b"b" * 600})
    with pytest.raises(PayloadError) as err:
        all_results(records, 2, "d-attempt1-rank0", limit=1000)
    message = str(err.value)
    assert "larger than max_result_bytes (1000 bytes)" in message
    paths = re.findall(r"it is kept in (\S+\.pkl)", message)
    assert [load_kept(p) for p in paths] == [b"a" * 600, b"b" * 600]


def test_run_all_with_the_mpi_launcher_is_refused_before_anything_starts() -> None:
    from sparktrain import ConfigurationError, SparkRunner
    from tests.fixtures import trainers

    runner = SparkRunner(np=-2, launcher="mpi", progress=False)
    with pytest.raises(ConfigurationError, match=r"use run\(\), or the default launcher"):
        runner.run_all(trainers.placed)
    assert runner.last_run is None  # nothing was launched
