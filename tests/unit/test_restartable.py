"""Which failures max_restarts relaunches."""

from __future__ import annotations

import pytest

from sparktrain.config import RunConfig
from sparktrain.driver.restarts import RestartPolicy, restartable
from sparktrain.errors import (
    RendezvousTimeoutError,
    RunStalledError,
    RunTimeoutError,
    WorkerFailedError,
    WorkerFailure,
)


def failed(**fields: object) -> WorkerFailedError:
    return WorkerFailedError({1: WorkerFailure(rank=1, **fields)})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error, opt_in, expected",
    [
        (failed(exit_code=-9, phase="lost"), False, True),  # SIGKILL
        (failed(exit_code=3, phase="lost"), False, True),  # os._exit
        (failed(phase="lost", message="executor lost"), False, True),
        (RendezvousTimeoutError("late", missing=[1]), False, True),
        (failed(exc_type="ValueError", user_error=True), False, False),
        (failed(exc_type="ValueError", user_error=True), True, True),
        (failed(exc_type="PayloadError", phase="load"), True, False),
        (failed(exc_type="PayloadError", phase="result", user_error=True), True, False),
        (RunTimeoutError("too long"), True, False),
        (RunStalledError("quiet"), False, True),  # a hang may not come back
    ],
)
def test_restartable(error, opt_in, expected):
    config = RunConfig(np=2, max_restarts=1, restart_on_user_error=opt_in)
    assert restartable(error, config) is expected


def test_root_cause_decides():
    early_kill = WorkerFailure(rank=0, exit_code=-9, phase="lost", time=1.0)
    later_exception = WorkerFailure(rank=1, exc_type="RuntimeError", user_error=True, time=2.0)
    error = WorkerFailedError({0: early_kill, 1: later_exception})
    assert restartable(error, RunConfig(np=2)) is True


def test_the_policy_counts_restarts_against_max_restarts_and_says_why(caplog):
    policy = RestartPolicy(RunConfig(np=2, max_restarts=2))
    lost = failed(exit_code=-9, phase="lost", message="its executor was lost")
    with caplog.at_level("WARNING", logger="sparktrain"):
        first = policy.restart(lost)
    assert first is not None and first.startswith("restart 1/2 after: ")
    assert "attempt 1/3 failed" in caplog.text and "starting attempt 2/3" in caplog.text
    # The user's own exception is not restarted, and does not use up a restart.
    assert policy.restart(failed(exc_type="ValueError", user_error=True)) is None
    assert policy.restarts == 1
    assert (policy.restart(lost) or "").startswith("restart 2/2 after: ")
    assert policy.restart(lost) is None  # max_restarts=2 reached
    assert policy.restarts == 2
