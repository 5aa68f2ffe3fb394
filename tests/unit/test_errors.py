"""The error tree, WorkerFailure records and WorkerFailedError's root-cause report."""

from __future__ import annotations

import json
import pickle

import pytest

from sparktrain import errors
from sparktrain.errors import (
    CapacityError,
    ConfigurationError,
    PayloadError,
    RendezvousTimeoutError,
    RunTimeoutError,
    SparkTrainError,
    WorkerFailedError,
    WorkerFailure,
)

TRACEBACK = """Traceback (most recent call last):
  File "/tmp/train.py", line 12, in train
    loss = step(batch)
  File "/tmp/train.py", line 7, in step
    raise ValueError("loss is nan")
ValueError: loss is nan
"""


def test_error_tree() -> None:
    for cls in (
        ConfigurationError,
        CapacityError,
        PayloadError,
        RendezvousTimeoutError,
        RunTimeoutError,
        WorkerFailedError,
    ):
        assert issubclass(cls, SparkTrainError)
    assert issubclass(SparkTrainError, Exception)
    assert issubclass(RendezvousTimeoutError, TimeoutError)
    assert issubclass(RunTimeoutError, TimeoutError)


def test_rendezvous_timeout_keeps_the_missing_ranks() -> None:
    error = RendezvousTimeoutError("ranks [1, 3] never arrived", missing=(1, 3))
    assert error.missing == [1, 3]
    assert str(error) == "ranks [1, 3] never arrived"
    assert RendezvousTimeoutError("x").missing == []


# --- WorkerFailure.how -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure, how",
    [
        (WorkerFailure(rank=0, exc_type="ValueError", exit_code=1), "raised ValueError"),
        (WorkerFailure(rank=0, exc_type="KeyboardInterrupt"), "raised KeyboardInterrupt"),
        (WorkerFailure(rank=0, exit_code=3), "exited with code 3"),
        (WorkerFailure(rank=0, exit_code=0), "exited with code 0"),
        (WorkerFailure(rank=0, exit_code=-9), "was killed by SIGKILL"),
        (WorkerFailure(rank=0, exit_code=-15), "was killed by SIGTERM"),
        (WorkerFailure(rank=0, exit_code=-11), "was killed by SIGSEGV"),
        (WorkerFailure(rank=0, exit_code=-6), "was killed by SIGABRT"),
        (WorkerFailure(rank=0, exit_code=-200), "was killed by signal 200"),
        (WorkerFailure(rank=0), "was lost"),
        (WorkerFailure(rank=0, phase="lost", message="executor lost"), "was lost"),
    ],
)
def test_how(failure: WorkerFailure, how: str) -> None:
    assert failure.how == how


# --- describe ----------------------------------------------------------------------------------


def test_describe_headline_traceback_and_tail() -> None:
    failure = WorkerFailure(
        rank=2,
        host="10.0.0.7",
        exc_type="ValueError",
        message="loss is nan",
        traceback=TRACEBACK,
        exit_code=1,
        output_tail=("epoch 0", "epoch 1"),
    )
    text = failure.describe()
    lines = text.splitlines()
    assert lines[0] == "rank 2 on 10.0.0.7 raised ValueError: loss is nan"
    assert lines[1:7] == TRACEBACK.rstrip().splitlines()
    assert lines[7] == "last 2 line(s) of rank 2's output:"
    assert lines[8:] == ["  | epoch 0", "  | epoch 1"]


def test_describe_without_host_message_or_output() -> None:
    assert WorkerFailure(rank=1, exit_code=-9).describe() == "rank 1 was killed by SIGKILL"


def test_traceback_is_shown_once_when_the_output_ends_with_it() -> None:
    tb_lines = TRACEBACK.rstrip().splitlines()
    failure = WorkerFailure(
        rank=0,
        exc_type="ValueError",
        message="loss is nan",
        traceback=TRACEBACK,
        output_tail=("step 1", "step 2", *tb_lines),
    )
    text = failure.describe()
    assert text.count("Traceback (most recent call last)") == 1
    assert text.count("ValueError: loss is nan") == 2  # headline + traceback
    assert "last 2 line(s) of rank 0's output:" in text
    assert text.endswith("  | step 1\n  | step 2")


def test_traceback_only_output_leaves_no_tail_section() -> None:
    failure = WorkerFailure(
        rank=0,
        exc_type="ValueError",
        traceback=TRACEBACK,
        output_tail=tuple(TRACEBACK.rstrip().splitlines()),
    )
    text = failure.describe()
    assert text.count("Traceback (most recent call last)") == 1
    assert "output:" not in text


def test_other_output_around_the_traceback_is_kept() -> None:
    # The worker's own echo of its traceback is dropped; the lines around it stay.
    tb_lines = TRACEBACK.rstrip().splitlines()
    failure = WorkerFailure(
        rank=0,
        exc_type="ValueError",
        traceback=TRACEBACK,
        output_tail=("before", *tb_lines, "after"),
    )
    text = failure.describe()
    assert text.count("Traceback (most recent call last)") == 1
    assert text.endswith("  | before\n  | after")


def test_partial_traceback_at_the_start_of_the_tail_is_dropped() -> None:
    tb_lines = TRACEBACK.rstrip().splitlines()
    failure = WorkerFailure(
        rank=0, exc_type="ValueError", traceback=TRACEBACK, output_tail=tuple(tb_lines[2:])
    )
    assert "output:" not in failure.describe()


def test_traceback_is_shown_once_when_an_exit_warning_follows_it() -> None:
    tb_lines = TRACEBACK.rstrip().splitlines()
    warning = "[W ProcessGroupNCCL.cpp:1250] Warning: destroy_process_group() was not called"
    failure = WorkerFailure(
        rank=0, exc_type="ValueError", traceback=TRACEBACK, output_tail=(*tb_lines, warning)
    )
    assert failure.describe().count("Traceback (most recent call last)") == 1


@pytest.mark.parametrize("tail_lines, shown", [(20, 20), (5, 5), (1, 1)])
def test_tail_is_truncated_to_the_last_lines(tail_lines: int, shown: int) -> None:
    output = tuple(f"line {i}" for i in range(50))
    failure = WorkerFailure(rank=3, exit_code=1, output_tail=output)
    lines = failure.describe(tail_lines=tail_lines).splitlines()
    assert lines[1] == f"last {shown} line(s) of rank 3's output:"
    assert lines[2:] == [f"  | line {i}" for i in range(50 - shown, 50)]


def test_default_tail_is_twenty_lines() -> None:
    failure = WorkerFailure(rank=0, exit_code=1, output_tail=tuple(str(i) for i in range(30)))
    assert "last 20 line(s)" in failure.describe()


# --- JSON --------------------------------------------------------------------------------------


def test_json_round_trip() -> None:
    failure = WorkerFailure(
        rank=4,
        host="h",
        exc_type="RuntimeError",
        message="boom",
        traceback=TRACEBACK,
        exit_code=1,
        output_tail=("a", "b"),
        time=1234.5,
        user_error=True,
        phase="result",
    )
    data = json.loads(json.dumps(failure.to_json()))
    assert data["output_tail"] == ["a", "b"]
    assert WorkerFailure.from_json(data) == failure


def test_from_json_ignores_unknown_keys_and_fills_defaults() -> None:
    failure = WorkerFailure.from_json({"rank": 1, "from_a_newer_version": 7, "output_tail": None})
    assert failure == WorkerFailure(rank=1)
    assert failure.output_tail == ()


# --- WorkerFailedError -------------------------------------------------------------------------


def _failure(rank: int, time: float, **kwargs: object) -> WorkerFailure:
    return WorkerFailure(rank=rank, time=time, host=f"host{rank}", **kwargs)  # type: ignore[arg-type]


def test_root_cause_is_the_earliest_failure() -> None:
    failures = {
        0: _failure(0, 30.0, exit_code=-15, message="stopped"),
        1: _failure(1, 10.0, exc_type="ValueError", message="bad batch", traceback=TRACEBACK),
        2: _failure(2, 20.0, exit_code=-9),
    }
    error = WorkerFailedError(failures)
    assert error.root_cause is failures[1]
    assert error.failures == failures
    text = str(error)
    lines = text.splitlines()
    assert lines[0] == "3 rank(s) failed. Root cause:"
    assert lines[2] == "rank 1 on host1 raised ValueError: bad batch"
    assert "Other failed ranks:" in text
    # The others follow in time order: rank 2 (t=20) then rank 0 (t=30).
    assert text.index("rank 2 on host2 was killed by SIGKILL") < text.index(
        "rank 0 on host0 was killed by SIGTERM: stopped"
    )
    assert text.index("Root cause") < text.index("rank 1 on host1") < text.index("Other failed")


def test_ties_in_time_are_broken_by_rank() -> None:
    failures = {r: _failure(r, 5.0, exit_code=1) for r in (3, 1, 2)}
    error = WorkerFailedError(failures)
    assert error.root_cause.rank == 1
    text = str(error)
    assert text.index("rank 1 on") < text.index("rank 2 on") < text.index("rank 3 on")


def test_single_failure_has_no_others_section_and_context_is_appended() -> None:
    error = WorkerFailedError({0: _failure(0, 1.0, exit_code=2)}, context=" on attempt 2 of 3")
    text = str(error)
    assert text.splitlines()[0] == "1 rank(s) failed on attempt 2 of 3. Root cause:"
    assert "Other failed ranks" not in text


def test_other_ranks_show_a_shorter_tail() -> None:
    output = tuple(f"out {i}" for i in range(40))
    failures = {
        0: _failure(0, 1.0, exit_code=1, output_tail=output),
        1: _failure(1, 2.0, exit_code=1, output_tail=output),
    }
    text = str(WorkerFailedError(failures))
    assert "last 20 line(s) of rank 0's output:" in text
    assert "last 5 line(s) of rank 1's output:" in text


def test_failures_are_copied() -> None:
    given = {0: _failure(0, 1.0, exit_code=1)}
    error = WorkerFailedError(given)
    given[1] = _failure(1, 0.5, exit_code=1)
    assert list(error.failures) == [0]


def test_no_failures_is_a_bug() -> None:
    with pytest.raises(ValueError, match="at least one failure"):
        WorkerFailedError({})


def test_worker_failed_error_pickles() -> None:
    error = WorkerFailedError({1: _failure(1, 2.0, exc_type="ValueError", message="x")})
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error)
    assert again.root_cause == error.root_cause


def test_other_errors_pickle() -> None:
    for error in (
        ConfigurationError("c"),
        CapacityError("x"),
        PayloadError("p"),
        RunTimeoutError("t"),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)


def test_module_exports_the_tree() -> None:
    import sparktrain

    for name in (
        "SparkTrainError",
        "ConfigurationError",
        "CapacityError",
        "PayloadError",
        "RendezvousTimeoutError",
        "RunTimeoutError",
        "WorkerFailedError",
        "WorkerFailure",
    ):
        assert getattr(sparktrain, name) is getattr(errors, name)
        assert name in sparktrain.__all__


def test_a_peer_loss_error_never_hides_the_rank_that_left() -> None:
    killed = WorkerFailure(rank=1, exit_code=-9, phase="lost", time=2.0)
    consequence = WorkerFailure(
        rank=0,
        exc_type="HorovodInternalError",
        message="Horovod has been shut down. This was caused by an exception on one of the ranks",
        time=1.0,  # seen first: the survivor noticed before the supervisor reaped the dead rank
    )
    error = WorkerFailedError({0: consequence, 1: killed})
    assert error.root_cause is killed
    assert consequence.follows_peer_loss and not killed.follows_peer_loss


def test_peer_loss_errors_alone_still_order_by_time() -> None:
    first = WorkerFailure(
        rank=1, exc_type="RuntimeError", message="Connection closed by peer", time=1.0
    )
    second = WorkerFailure(rank=0, exc_type="DistBackendError", message="x", time=2.0)
    assert WorkerFailedError({0: second, 1: first}).root_cause is first
