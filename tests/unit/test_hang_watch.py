"""The hang watch: its rule (counts and silence → the ranks behind), its clock, the rank's
counters and the task's reports of them. Real runs that hang are in test_stuck_runs.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from sparktrain import RunHungError, RunStalledError
from sparktrain.config import RunConfig
from sparktrain.driver.hang import HangWatch, behind
from sparktrain.driver.validate import valid
from sparktrain.task.collectives import CollectiveSlots, interval_for
from sparktrain.wire import protocol
from sparktrain.worker.collectives import Counters, counted

ALL = frozenset({0, 1, 2})

# counts by rank (entered, completed), the ranks silent for stall_timeout -> the ranks behind
RULE: dict[str, tuple[dict[int, tuple[int, int]], frozenset[int], list[int]]] = {
    "every rank computes outside collectives": ({0: (5, 5), 1: (5, 5), 2: (5, 5)}, ALL, []),
    "no collective yet, every rank silent": ({0: (0, 0), 1: (0, 0), 2: (0, 0)}, ALL, []),
    "two wait, one silent outside": ({0: (6, 5), 1: (6, 5), 2: (5, 5)}, ALL, [2]),
    "one waits, two silent outside": ({0: (1, 0), 1: (0, 0), 2: (0, 0)}, ALL, [1, 2]),
    "the rank outside still prints": ({0: (6, 5), 1: (6, 5), 2: (5, 5)}, frozenset({0, 1}), []),
    "one of two outside prints": ({0: (6, 5), 1: (5, 5), 2: (5, 5)}, frozenset({0, 1}), []),
    "the waiting ones print (they wait)": ({0: (6, 5), 1: (5, 5)}, frozenset({1}), [1]),
    "all inside, one entered fewer": ({0: (7, 6), 1: (7, 6), 2: (6, 5)}, ALL, [2]),
    "all inside, two entered fewer": ({0: (9, 8), 1: (8, 7), 2: (8, 7)}, ALL, [1, 2]),
    "all inside the same collective": ({0: (7, 6), 1: (7, 6), 2: (7, 6)}, ALL, []),
    "async: several outstanding on one": ({0: (9, 6), 1: (7, 6)}, ALL, [1]),
    "one rank alone, inside": ({0: (1, 0)}, ALL, []),
}


@pytest.mark.parametrize("case", list(RULE), ids=list(RULE))
def test_the_rule_names_the_ranks_behind(case: str) -> None:
    counts, silent, expected = RULE[case]
    assert behind(counts, silent) == expected


def _config(np: int, **settings: object) -> RunConfig:
    return RunConfig.resolve(np, settings, environ={})


def _watch(timeout: float = 60.0) -> HangWatch:
    watch = HangWatch(_config(-3, stall_timeout=timeout))
    watch.start(1000.0, [0, 1, 2])
    return watch


def test_the_watch_looks_once_no_count_moved_for_stall_timeout() -> None:
    watch = _watch()
    assert watch.deadline() == 1060.0
    assert watch.first_look() is None  # no rank waits: the stall watch keeps its own time
    watch.moved([[0, 1, 0], [1, 1, 0]], 1010.0)  # ranks 0 and 1 wait, rank 2 never came
    assert watch.deadline() == 1070.0
    assert watch.first_look() == 1070.0
    assert watch.look(1069.0) == []  # not yet due
    assert watch.look(1070.0) == [2]
    error = watch.error([2], {2: {"host": "h2", "pid": 42}, 0: {"host": "h0", "pid": 40}})
    assert isinstance(error, RunHungError) and isinstance(error, RunStalledError)
    text = str(error)
    assert text.startswith(
        "the run hung: rank 2 (host h2, pid 42; outside any collective, 0 done) is behind, "
        "while rank 0 (host h0, pid 40; waiting in collective #1), rank 1 (host ?, pid ?; "
        "waiting in collective #1) waited, and no rank moved for 60s "
        "(stall_timeout, spark.sparktrain.stallTimeout)"
    )
    assert "raise stall_timeout" in text


def test_a_rank_that_prints_outside_collectives_is_not_behind_and_is_looked_at_again() -> None:
    watch = _watch(timeout=40.0)
    watch.moved([[0, 1, 0], [1, 1, 0]], 1000.0)
    watch.activity(2, 1030.0)  # rank 2 saves a checkpoint and says so
    assert watch.look(1040.0) == []
    assert watch.deadline() == 1050.0  # again a quarter of stall_timeout later (at most 10 s)
    assert watch.look(1050.0) == []  # it printed 20 s ago
    assert watch.look(1070.0) == [2]  # silent for 40 s now


def test_a_count_that_moves_restarts_the_wait() -> None:
    watch = _watch()
    watch.moved([[0, 1, 0], [1, 1, 0]], 1000.0)
    watch.moved([[2, 1, 0]], 1050.0)  # rank 2 joined: they all wait in the same one
    watch.moved([[2, 1, 0]], 1055.0)  # the same counts again move nothing
    assert watch.deadline() == 1110.0
    assert watch.look(1110.0) == []
    watch.moved([[9, 5, 5]], 1111.0)  # a rank this run does not have is ignored
    assert watch.deadline() == 1120.0


def test_the_stall_watch_waits_for_the_first_look_only_while_a_rank_waits() -> None:
    watch = _watch()
    watch.moved([[0, 3, 2]], 1000.0)
    assert watch.first_look() == 1060.0
    watch.moved([[0, 3, 3]], 1001.0)  # it left: no rank waits
    assert watch.first_look() is None


def test_off_never_looks() -> None:
    watch = HangWatch(_config(-2, stall_timeout="off"))
    watch.start(0.0, [0, 1])
    watch.moved([[0, 1, 0]], 1.0)
    assert watch.deadline() is None and watch.first_look() is None
    assert watch.look(1e9) == []
    assert interval_for(_config(-2, stall_timeout="off")) is None


def test_the_default_is_five_minutes_and_the_reports_come_every_ten_seconds_at_most() -> None:
    config = _config(-2)
    assert config.stall_timeout == 300.0
    assert interval_for(config) == 10.0
    assert interval_for(_config(-2, stall_timeout=2)) == 0.5


@pytest.mark.parametrize(
    ("rows", "ok"),
    [
        ([[0, 3, 2], [1, 3, 3]], True),
        ([], True),
        ([[0, 3]], False),
        ([[0, -1, 0]], False),
        ([[0, 1.5, 0]], False),
        ([[0, True, 0]], False),
        (["0,1,0"], False),
    ],
)
def test_a_collectives_message_is_checked(rows: list[Any], ok: bool) -> None:
    message = protocol.COLLECTIVES(counts=rows)
    kind = protocol.parse(message, protocol.TO_DRIVER)
    assert kind is protocol.COLLECTIVES
    assert valid(kind, message, 2) is ok


# --- the rank's counters and the task's reports ------------------------------------------------


def test_the_task_reads_what_the_rank_counts_and_reports_only_moves(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    slots = CollectiveSlots(tmp_path, [3, 4], sent.append, interval=3600)
    try:
        assert (tmp_path / "collectives-3").stat().st_mode & 0o777 == 0o600
        rank3 = Counters(slots.env(3)["_SPARKTRAIN_COLLECTIVES"])
        slots.report()
        assert sent == [protocol.COLLECTIVES(counts=[[3, 0, 0], [4, 0, 0]])]
        rank3.enter()
        assert slots.read() == {3: (1, 0), 4: (0, 0)}
        rank3.leave()
        rank3.enter()
        slots.report()
        slots.report()  # nothing moved since: nothing sent
        assert sent[1:] == [protocol.COLLECTIVES(counts=[[3, 2, 1], [4, 0, 0]])]
    finally:
        slots.close()


def test_a_file_already_there_is_refused(tmp_path: Path) -> None:
    (tmp_path / "collectives-0").write_bytes(bytes(16))
    with pytest.raises(FileExistsError):
        CollectiveSlots(tmp_path, [0], lambda message: None, interval=1)


@pytest.fixture
def counters(tmp_path: Path) -> Counters:
    slots = CollectiveSlots(tmp_path, [0], lambda message: None, interval=3600)
    return Counters(str(slots.paths[0]))


def test_a_blocking_collective_is_inside_while_it_runs(counters: Counters) -> None:
    seen: list[tuple[int, int]] = []

    def collective(x: int) -> None:
        seen.append(counters.counts())

    wrapped = counted(collective, counters)
    assert counted(wrapped, counters) is wrapped  # wrapping twice counts once
    assert wrapped(1) is None
    assert seen == [(1, 0)] and counters.counts() == (1, 1)
    assert wrapped.__name__ == "collective"


def test_a_failed_collective_is_left(counters: Counters) -> None:
    def collective() -> None:
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(RuntimeError):
        counted(collective, counters)()
    assert counters.counts() == (1, 1)


def test_an_async_collective_is_inside_until_its_future_completes(counters: Counters) -> None:
    future: torch.futures.Future[None] = torch.futures.Future()

    class Work:
        def wait(self) -> None:
            future.wait()

        def get_future(self) -> torch.futures.Future[None]:
            return future

    work = counted(lambda: Work(), counters)()
    assert counters.counts() == (1, 0)
    done = threading.Thread(target=future.set_result, args=(None,))
    done.start()
    done.join()
    work.wait()
    assert counters.counts() == (1, 1)


def test_real_gloo_collectives_are_counted_sync_and_async(
    counters: Counters, tmp_path: Path
) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    group = dist.ProcessGroupGloo(store, 0, 1)
    reduce = counted(dist.all_reduce, counters)
    tensor = torch.ones(3)
    reduce(tensor, group=group)
    assert counters.counts() == (1, 1)
    work = reduce(tensor, group=group, async_op=True)
    work.wait()
    work.get_future().wait()
    assert counters.counts() == (2, 2)
