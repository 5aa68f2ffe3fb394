"""How the ranks that were still running when a run was stopped are shown in its error."""

from __future__ import annotations

import pickle

import pytest

from sparktrain.errors import (
    RunStalledError,
    RunTimeoutError,
    WorkerFailedError,
    WorkerFailure,
    describe_stopped,
)


def stopped(rank: int, where: str) -> WorkerFailure:
    return WorkerFailure(
        rank=rank,
        host="h",
        phase="stopped",
        exit_code=-15,
        where=where,
        stack=f'  File "/job/train.py", line {rank}, in train',
        output_tail=("epoch 1", "epoch 2"),
    )


def test_a_stopped_rank_says_where_it_was() -> None:
    text = stopped(0, "in train at train.py:17: time.sleep(60)").describe()
    assert text.splitlines()[0] == (
        "rank 0 on h was still running: in train at train.py:17: time.sleep(60)"
    )
    assert "its main thread's stack (most recent call last):" in text
    assert "  | epoch 2" in text
    no_stack = WorkerFailure(rank=2, phase="stopped", message="its stack could not be read")
    assert describe_stopped({2: no_stack}).splitlines()[1] == (
        "  rank 2: its stack could not be read"
    )


def test_the_timeout_error_lists_every_stopped_rank_then_their_stacks() -> None:
    ranks = {1: stopped(1, "in train at train.py:17"), 0: stopped(0, "in all_reduce (...)")}
    error = RunTimeoutError("the run exceeded timeout=5s", ranks)
    lines = str(error).splitlines()
    assert lines[:5] == [
        "the run exceeded timeout=5s",
        "",
        "Where each rank was when it was stopped:",
        "  rank 0: in all_reduce (...)",
        "  rank 1: in train at train.py:17",
    ]
    assert str(error).index("rank 0 on h was still") < str(error).index("rank 1 on h was still")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.reason == error.reason
    assert str(RunTimeoutError("plain")) == "plain"
    stalled = pickle.loads(pickle.dumps(RunStalledError("quiet", ranks)))
    assert isinstance(stalled, RunTimeoutError) and stalled.stopped.keys() == {0, 1}


def test_worker_failed_error_keeps_the_root_cause_first_and_the_stopped_ranks_last() -> None:
    root = WorkerFailure(rank=1, exc_type="ValueError", message="nan", time=1.0)
    peer = WorkerFailure(rank=2, exc_type="RuntimeError", message="Connection reset by peer")
    error = WorkerFailedError({1: root, 2: peer}, stopped={0: stopped(0, "in train at t.py:1")})
    text = str(error)
    assert text.startswith("2 rank(s) failed. Root cause:")
    assert error.root_cause is root
    assert text.index("rank 1 raised ValueError") < text.index("rank 2 raised RuntimeError")
    assert text.index("rank 2 raised") < text.index("Where each rank was when it was stopped:")
    assert "  rank 0: in train at t.py:1" in text
    assert str(pickle.loads(pickle.dumps(error))) == text
    # A rank is never both failed and stopped.
    assert WorkerFailedError({1: root}, stopped={1: stopped(1, "x")}).stopped == {}


def test_stack_fields_travel_as_json() -> None:
    failure = stopped(3, "in train at train.py:3")
    assert WorkerFailure.from_json(failure.to_json()) == failure
    with pytest.raises(ValueError):
        WorkerFailure.from_json({"rank": 0, "stack": 5})
