"""Collectives on a group whose blocking calls return once queued (NCCL): issued with
``async_op=True`` and counted completed only when their work is. No GPU here: Gloo stands in
for NCCL by being named a queued backend, and fake works stand in for ones the GPU has not run."""

from __future__ import annotations

import functools
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from sparktrain.task.collectives import CollectiveSlots
from sparktrain.worker import collectives
from sparktrain.worker.collectives import Counters, counted
from sparktrain.worker.outstanding import Outstanding

# A Gloo group's timeout: a test that fails ends instead of hanging.
WAIT = timedelta(seconds=60)


@pytest.fixture
def counters(tmp_path: Path) -> Counters:
    slots = CollectiveSlots(tmp_path, [0], lambda message: None, interval=3600)
    return Counters(str(slots.paths[0]))


def _spied(fn: Any, seen: list[Any]) -> Any:
    """``fn`` (its signature kept), noting the ``async_op`` of each call."""

    @functools.wraps(fn)
    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("async_op"))
        return fn(*args, **kwargs)

    return spy


def _gloo_pair(tmp_path: Path, fn: Any) -> list[Any]:
    """``fn(group, rank)`` on both ranks of a two-rank Gloo group (threads); their results."""
    store_path = str(tmp_path / "store")
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group = dist.ProcessGroupGloo(dist.FileStore(store_path, 2), r, 2, WAIT)
            results[r] = fn(group, r)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def test_a_blocking_collective_on_a_queued_backend_is_issued_async_and_counted_once(
    counters: Counters, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collectives, "QUEUED_BACKENDS", ("gloo",))
    seen: list[Any] = []
    reduce = counted(_spied(dist.all_reduce, seen), counters)

    def blocking_sum(group: Any, rank: int) -> tuple[Any, torch.Tensor]:
        tensor = torch.full((3,), float(rank + 1))
        return reduce(tensor, group=group), tensor

    results = _gloo_pair(tmp_path, blocking_sum)
    assert seen == [True, True]  # issued async on both ranks
    for returned, tensor in results:
        assert returned is None  # what a blocking all_reduce returns
        assert tensor.tolist() == [3.0, 3.0, 3.0]  # 1 + 2, waited for
    assert counters.counts() == (2, 2)  # both ranks share the counters here
    assert len(counters.outstanding) == 0


def test_gloo_keeps_its_own_path(counters: Counters, tmp_path: Path) -> None:
    seen: list[Any] = []
    reduce = counted(_spied(dist.all_reduce, seen), counters)
    _gloo_pair(tmp_path, lambda group, rank: reduce(torch.ones(2), group=group))
    assert seen == [None, None]  # called as the user called it
    assert counters.counts() == (2, 2)


class FakeWork:
    """A queued collective's work: NCCL's wait returns before the GPU has run it."""

    def __init__(self, fail: bool = False) -> None:
        self.done = False
        self.fail = fail

    def wait(self) -> bool:
        if self.fail:
            self.done = True
            raise RuntimeError("NCCL communicator was aborted")
        return True

    def is_completed(self) -> bool:
        return self.done


def _fake_collective(works: list[FakeWork], fail: bool = False) -> Any:
    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        works.append(FakeWork(fail))
        return works[-1] if async_op else None

    return all_reduce


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "is_queued", lambda group: True)


@pytest.mark.usefixtures("queued")
def test_a_blocking_collective_is_inside_until_the_device_has_run_it(
    counters: Counters,
) -> None:
    works: list[FakeWork] = []
    reduce = counted(_fake_collective(works), counters)
    assert reduce(torch.ones(1)) is None
    assert counters.counts() == (1, 0)  # returned, but not run yet: a later .item() would block
    counters.outstanding.settle()
    assert counters.counts() == (1, 0)
    works[0].done = True
    counters.outstanding.settle()
    counters.outstanding.settle()
    assert counters.counts() == (1, 1)


@pytest.mark.usefixtures("queued")
def test_an_async_collective_asked_by_the_user_is_returned_and_counted_by_its_work(
    counters: Counters,
) -> None:
    works: list[FakeWork] = []
    reduce = counted(_fake_collective(works), counters)
    work = reduce(torch.ones(1), None, None, True)  # async_op given by position
    assert work is works[0]
    assert counters.counts() == (1, 0)
    work.done = True
    counters.outstanding.settle()
    assert counters.counts() == (1, 1)


@pytest.mark.usefixtures("queued")
def test_a_failed_wait_is_counted_completed_once(counters: Counters) -> None:
    works: list[FakeWork] = []
    reduce = counted(_fake_collective(works, fail=True), counters)
    with pytest.raises(RuntimeError, match="aborted"):
        reduce(torch.ones(1))
    assert counters.counts() == (1, 1)
    counters.outstanding.settle()  # the failed work is done too: not counted again
    assert counters.counts() == (1, 1)


@pytest.mark.usefixtures("queued")
def test_a_collective_that_raises_when_issued_is_left(counters: Counters) -> None:
    def all_reduce(tensor: Any, group: Any = None, async_op: bool = False) -> None:
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(RuntimeError, match="closed"):
        counted(all_reduce, counters)(torch.ones(1))
    assert counters.counts() == (1, 1)


@pytest.mark.usefixtures("queued")
def test_functions_without_async_op_count_as_before(counters: Counters) -> None:
    seen: list[tuple[int, int]] = []

    def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
        seen.append(counters.counts())

    counted(all_gather_object, counters)([None], 1)
    assert seen == [(1, 0)] and counters.counts() == (1, 1)


@pytest.mark.usefixtures("queued")
def test_a_collective_captured_into_a_cuda_graph_counts_as_it_returns(
    counters: Counters, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collectives, "_capturing", lambda: True)
    seen: list[bool] = []

    def all_reduce(tensor: Any, group: Any = None, async_op: bool = False) -> None:
        seen.append(async_op)

    counted(all_reduce, counters)(torch.ones(1))
    assert seen == [False]  # issued as asked: it runs when the graph is replayed
    assert counters.counts() == (1, 1) and len(counters.outstanding) == 0


def test_outstanding_works_are_looked_at_on_their_own() -> None:
    left = threading.Event()
    outstanding = Outstanding(left.set, every=0.01)
    work = FakeWork()
    work.done = True
    outstanding.add(work)
    assert left.wait(10)  # the watcher counted it, with no call from the rank
    assert len(outstanding) == 0


def test_the_backend_of_a_group_made_by_hand_is_its_name(tmp_path: Path) -> None:
    group = dist.ProcessGroupGloo(dist.FileStore(str(tmp_path / "store"), 1), 0, 1, WAIT)
    assert collectives.backend_name(group) == "gloo"
    assert not collectives.is_queued(group)
    assert collectives.backend_name(None) == ""  # no default group here
