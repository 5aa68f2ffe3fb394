"""Which failures max_restarts relaunches."""

from __future__ import annotations

import pytest

from sparktrain.config import RunConfig
from sparktrain.driver.restarts import restartable
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
def testrestartable(error, opt_in, expected):
    config = RunConfig(np=2, max_restarts=1, restart_on_user_error=opt_in)
    assert restartable(error, config) is expected


def test_root_cause_decides():
    early_kill = WorkerFailure(rank=0, exit_code=-9, phase="lost", time=1.0)
    later_exception = WorkerFailure(rank=1, exc_type="RuntimeError", user_error=True, time=2.0)
    error = WorkerFailedError({0: early_kill, 1: later_exception})
    assert restartable(error, RunConfig(np=2)) is True
