"""Stopping a run never costs the cluster an executor, in whatever phase the stop lands.

Each phase is stopped 20 times in a row on the shared session; the executors (host and port
of each executor process) must be the same ones afterwards: a cancelled barrier task that
crashed its executor would show up as an executor replaced.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparktrain import (
    CapacityError,
    RendezvousTimeoutError,
    RunTimeoutError,
    SparkRunner,
    WorkerFailedError,
)
from sparktrain.driver.capacity import busy_slots
from tests.fixtures import trainers
from tests.helpers import (
    alive,
    interrupt_once_started,
    recorded_pids,
    settled_tracker,
    wait_for,
    wait_gone,
)

ROUNDS = 20

pytestmark = pytest.mark.slow


def executors(spark: Any) -> list[str]:
    """``host:port`` of every executor process (and the driver's block manager)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sorted(f"{info.host()}:{info.port()}" for info in infos)


def _rendezvous(tmp: Path) -> None:
    # Both tasks hang before the rendezvous, so the stop lands there whatever the machine's
    # load: with one task let through, a busy machine can make it late too (both missing),
    # which is right, but not this phase's question. Naming exactly the late task is
    # test_runner.py's test_rank_that_never_reaches_rendezvous.
    # Neither task can arrive, so the shortest start_timeout stops the run in this phase too.
    def hang(index: int) -> None:  # nested: pickled by value, as executors need
        time.sleep(3600)

    runner = SparkRunner(np=2, start_timeout=1, grace_period=1)
    runner._pre_rendezvous_hook = hang
    with pytest.raises(RendezvousTimeoutError) as info:
        runner.run(trainers.noop)
    assert info.value.missing == [0, 1]


def _training(tmp: Path) -> None:
    with pytest.raises(RunTimeoutError):
        SparkRunner(np=2, timeout=2, grace_period=1).run(trainers.block_forever, str(tmp))
    assert alive(recorded_pids(tmp)) == []


def _collective(tmp: Path) -> None:
    with pytest.raises(WorkerFailedError, match="injected failure on rank 1"):
        SparkRunner(np=2, grace_period=1).run(trainers.fail_on_rank, str(tmp), "raise")
    assert alive(recorded_pids(tmp)) == []


def _finished(tmp: Path) -> None:
    assert SparkRunner(np=2).run(trainers.noop) == 0


# Twenty stops of 2-15 s each (a start_timeout of 1 s or a timeout of 2 s, a grace period of
# 1 s, the cancel's confirmation, the slots' release) after a first, cold run: 18 rounds took
# 126 s beside two other suites, and the first run over a minute.
@pytest.mark.timeout(600, func_only=True)
@pytest.mark.parametrize(
    "phase",
    [_rendezvous, _training, _collective, _finished],
    ids=["rendezvous", "training", "collective", "teardown"],
)
def test_stopping_twenty_times_loses_no_executor(spark, tmp_path, phase):
    # One run first: the executors have registered and their Python workers are warm, so
    # each round below is decided by its phase, not by a cold start.
    assert SparkRunner(np=2).run(trainers.noop) == 0
    before = executors(spark)
    assert len(before) == 3  # the driver and two executors
    for i in range(ROUNDS):
        folder = tmp_path / str(i)
        folder.mkdir()
        phase(folder)
        assert executors(spark) == before, f"an executor was replaced in round {i + 1}"
    assert settled_tracker(spark).getActiveJobsIds() == []


class _CtrlCWhenWaiting(logging.Handler):
    """Presses Ctrl-C (a real SIGINT to this process) when the run starts waiting for slots."""

    def emit(self, record: logging.LogRecord) -> None:
        if "busy with other jobs" in record.getMessage():
            os.kill(os.getpid(), signal.SIGINT)


def test_stopping_while_waiting_for_slots_loses_no_executor_and_no_other_job(spark, tmp_path):
    """Another job holds one of the two slots: each run waits for it, and is stopped while it
    waits, by its own capacity_wait or by Ctrl-C. The other job must go on untouched."""
    assert SparkRunner(np=2).run(trainers.noop) == 0
    before = executors(spark)
    sc = spark.sparkContext
    release = tmp_path / "release"
    outcome: list[BaseException | None] = []

    def hold_slot(_item: object, release: str = str(release)) -> None:
        # Nested, so pickled by value: the executors cannot import the tests.
        deadline = time.monotonic() + 600
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)

    def other_job() -> None:
        sc.setJobGroup("someone-else", "another job of this session")
        try:
            sc.parallelize([0], 1).foreach(hold_slot)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcome.append(exc)

    holder = threading.Thread(target=other_job, daemon=True)
    holder.start()
    deadline = time.monotonic() + 60
    while busy_slots(sc) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert busy_slots(sc) == 1
    ctrl_c = _CtrlCWhenWaiting()
    logger = logging.getLogger("sparktrain.driver.capacity")
    try:
        for i in range(ROUNDS):
            if i % 2:
                logger.addHandler(ctrl_c)
                try:
                    with pytest.raises(KeyboardInterrupt):
                        SparkRunner(np=2, capacity_wait=30).run(trainers.noop)
                finally:
                    logger.removeHandler(ctrl_c)
            else:
                with pytest.raises(CapacityError, match="1 of the cluster's 2 slots are busy"):
                    SparkRunner(np=2, capacity_wait=1).run(trainers.noop)
            assert executors(spark) == before, f"an executor was replaced in round {i + 1}"
            assert holder.is_alive(), f"the other job was cancelled in round {i + 1}"
    finally:
        release.touch()
        holder.join(60)
    assert outcome == [None]
    assert executors(spark) == before


def test_system_exit_from_a_signal_handler_cancels_the_job(spark, tmp_path):
    """A driver script whose SIGTERM handler exits (a scheduler's stop before its kill): the
    call raises SystemExit at once, and the run's job does not go on holding the slots. The
    tasks hang before the rendezvous, where only cancelling the job ends them."""
    started = tmp_path / "started"
    started.mkdir()

    def hang(index: int, folder: str = str(started)) -> None:  # nested: pickled by value
        Path(folder, f"{index}.started").write_text(str(os.getpid()))
        time.sleep(3600)

    def exit_on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(143)

    runner = SparkRunner(np=2, start_timeout=600)
    runner._pre_rendezvous_hook = hang
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        interrupt_once_started(started, "*.started", signum=signal.SIGTERM)
        with pytest.raises(SystemExit):
            runner.run(trainers.noop)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(list(started.glob("*.started"))) == 2, "the tasks never reached the hook"
    wait_for(
        lambda: settled_tracker(spark).getActiveJobsIds() == [],
        timeout=60,
        what="the run's job ending after SystemExit",
    )
    wait_gone([int(p.read_text()) for p in started.glob("*.started")], timeout=60)
    assert SparkRunner(np=2, capacity_wait=5).run(trainers.noop) == 0
