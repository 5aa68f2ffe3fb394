"""check_capacity against a fake SparkContext: refuse early, with what was found."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from sparktrain.driver import capacity
from sparktrain.driver.capacity import busy_slots, check_capacity, total_slots
from sparktrain.errors import CapacityError


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


@dataclasses.dataclass
class StageInfo:
    numActiveTasks: int  # noqa: N815 - Spark's name


class FakeTracker:
    def __init__(self, busy: list[int]) -> None:
        self.busy = busy

    def getActiveStageIds(self) -> list[int]:  # noqa: N802
        return list(range(len(self.busy))) + [99]  # 99: a stage that ended meanwhile

    def getStageInfo(self, stage_id: int) -> StageInfo | None:  # noqa: N802
        return StageInfo(self.busy[stage_id]) if stage_id < len(self.busy) else None


class FakeProfileManager:
    def defaultResourceProfile(self) -> str:  # noqa: N802
        return "default-profile"


class FakeScalaContext:
    """``sc._jsc.sc()``: the JVM SparkContext through Py4J."""

    def __init__(self, slots: Callable[[], int], profiles: bool = True) -> None:
        self._slots = slots
        self.calls = 0
        self._profiles = profiles
        self.executors = 1
        self.running: list[int] = []  # running tasks per executor

    def resourceProfileManager(self) -> FakeProfileManager:  # noqa: N802
        if not self._profiles:
            raise AttributeError("no resource profiles on this Spark")
        return FakeProfileManager()

    def maxNumConcurrentTasks(self, profile: str) -> int:  # noqa: N802
        assert profile == "default-profile"
        self.calls += 1
        return self._slots()

    def statusTracker(self) -> Any:  # noqa: N802
        """The JVM tracker: each executor's running tasks (those of cancelled jobs too)."""
        running = self.running

        class Executor:
            def __init__(self, n: int) -> None:
                self.n = n

            def numRunningTasks(self) -> int:  # noqa: N802
                return self.n

        class Tracker:
            def getExecutorInfos(self) -> list[Executor]:  # noqa: N802
                return [Executor(0)] + [Executor(n) for n in running]  # the driver, executors

        return Tracker()

    def getExecutorMemoryStatus(self) -> Any:  # noqa: N802
        class Status:
            def __init__(self, n: int) -> None:
                self.n = n

            def size(self) -> int:
                return self.n

        return Status(self.executors)


class FakeJsc:
    def __init__(self, scala: FakeScalaContext) -> None:
        self._scala = scala

    def sc(self) -> FakeScalaContext:
        return self._scala


class FakeSc:
    def __init__(
        self,
        slots: int | Callable[[], int] = 4,
        busy: list[int] | None = None,
        conf: dict[str, str] | None = None,
        age: float = 3600.0,
        master: str = "spark://master:7077",
        profiles: bool = True,
        default_parallelism: int = 2,
    ) -> None:
        slot_fn = slots if callable(slots) else (lambda: slots)
        self._jsc = FakeJsc(FakeScalaContext(slot_fn, profiles))
        self._tracker = FakeTracker(busy or [])
        self._conf = FakeConf(conf or {})
        self.startTime = int((time.time() - age) * 1000)  # ms since the epoch, like Spark
        self.master = master
        self.defaultParallelism = default_parallelism

    def getConf(self) -> FakeConf:  # noqa: N802
        return self._conf

    def statusTracker(self) -> FakeTracker:  # noqa: N802
        return self._tracker

    @property
    def slot_calls(self) -> int:
        return self._jsc.sc().calls


class FakeClock:
    """capacity's ``time`` module: ``sleep`` is logged and moves ``time()`` on at once."""

    def __init__(self) -> None:
        self.now = time.time()
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def waited(self) -> float:
        return sum(self.sleeps)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """No test here waits for real: capacity's waits are read off this clock."""
    fake = FakeClock()
    monkeypatch.setattr(capacity, "time", fake)
    return fake


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_dynamic_allocation_is_refused(value: str) -> None:
    sc = FakeSc(slots=100, conf={"spark.dynamicAllocation.enabled": value})
    with pytest.raises(CapacityError, match="spark.dynamicAllocation.enabled=false") as info:
        check_capacity(sc, 2, wait=30)
    assert "spark.executor.instances" in str(info.value)
    assert sc.slot_calls == 0  # refused before looking at slots


def test_dynamic_allocation_off_is_fine(clock: FakeClock) -> None:
    sc = FakeSc(slots=4, conf={"spark.dynamicAllocation.enabled": "false"})
    check_capacity(sc, 4, 30)
    assert sc.slot_calls == 1 and clock.sleeps == []  # looked at the slots, did not wait


@pytest.mark.parametrize("n, slots", [(1, 1), (2, 4), (4, 4)])
def test_enough_slots_returns(n: int, slots: int, clock: FakeClock) -> None:
    sc = FakeSc(slots=slots)
    check_capacity(sc, n, wait=30)
    assert clock.sleeps == []
    assert sc.slot_calls == 1


def test_too_few_slots_on_an_old_session_fails_at_once(clock: FakeClock) -> None:
    sc = FakeSc(
        slots=2,
        conf={"spark.task.cpus": "2", "spark.task.resource.gpu.amount": "1"},
        master="spark://m:7077",
    )
    with pytest.raises(CapacityError) as info:
        check_capacity(sc, 3, wait=30)
    assert clock.sleeps == []
    message = str(info.value)
    assert "np=3 needs 3 task slots at once" in message
    assert "the cluster has 2" in message
    assert "spark.task.cpus=2" in message and "spark.task.resource.gpu.amount=1" in message
    assert "master spark://m:7077" in message
    assert "Lower np to 2 or less" in message
    assert "spark.executor.instances" in message and "spark.executor.cores" in message


def test_too_few_slots_message_without_gpus() -> None:
    with pytest.raises(CapacityError) as info:
        check_capacity(FakeSc(slots=0), 1, wait=30)
    assert "(spark.task.cpus=1, master" in str(info.value)
    assert "gpu" not in str(info.value)


def test_busy_slots_fail_after_a_short_wait(clock: FakeClock) -> None:
    sc = FakeSc(slots=4, busy=[2, 1], age=0.0)  # even a young session: slots exist, but busy
    with pytest.raises(CapacityError) as info:
        check_capacity(sc, 2, wait=30)
    # BUSY_WAIT (15 s), not the 30 s capacity_wait, polled all the while.
    assert capacity.BUSY_WAIT <= clock.waited() < capacity.BUSY_WAIT + capacity.POLL_INTERVAL
    assert set(clock.sleeps) == {capacity.POLL_INTERVAL}
    message = str(info.value)
    assert "np=2 needs 2 free task slots" in message
    assert "3 of the cluster's 4 slots are busy with other jobs" in message


def test_busy_slots_wait_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    sc = FakeSc(slots=2, busy=[2])
    looks: list[int] = []

    def free_on_third_look(stage_id: int) -> StageInfo | None:
        looks.append(stage_id)
        return StageInfo(2 if len(looks) < 3 else 0) if stage_id == 0 else None

    sc._tracker.getStageInfo = free_on_third_look  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        check_capacity(sc, 2, wait=30)
    assert [r.getMessage() for r in caplog.records] == [
        "np=2: 2 of the cluster's 2 task slots are busy with other jobs; waiting up to 15s "
        "for them to free up"
    ]


def test_slots_freed_by_an_ending_job_are_used() -> None:
    sc = FakeSc(slots=2, busy=[2])

    def free_on_third_look(stage_id: int) -> StageInfo | None:
        calls.append(stage_id)
        return StageInfo(2 if len(calls) < 3 else 0) if stage_id == 0 else None

    calls: list[int] = []
    sc._tracker.getStageInfo = free_on_third_look  # type: ignore[method-assign]
    check_capacity(sc, 2, wait=30)
    assert len(calls) >= 3


def test_busy_but_enough_free_slots_returns(clock: FakeClock) -> None:
    sc = FakeSc(slots=8, busy=[3])
    check_capacity(sc, 4, wait=30)
    assert sc.slot_calls == 1 and clock.sleeps == []  # 5 of 8 free: no wait for the busy 3


def test_young_session_waits_for_executors_to_register(
    caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    answers = iter([0, 0, 1, 3])
    sc = FakeSc(slots=lambda: next(answers, 3), age=0.0)
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        check_capacity(sc, 3, wait=30)
    assert clock.sleeps == [capacity.POLL_INTERVAL] * 3  # one poll per look, until 3 came
    assert sc.slot_calls == 4
    # Said once, not at every poll, with the setting that bounds the wait.
    [record] = caplog.records
    assert record.name == "sparktrain.driver.capacity" and record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith("np=3 needs 3 task slots at once and the cluster has 0 so far")
    assert "waiting up to 30s for executors to register" in message
    assert "spark.sparktrain.capacityWait" in message


def test_enough_slots_at_once_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="sparktrain"):
        check_capacity(FakeSc(slots=4), 2, wait=30)
    assert caplog.records == []


def test_young_session_gives_up_at_its_deadline(clock: FakeClock) -> None:
    sc = FakeSc(slots=1, age=0.0)
    with pytest.raises(CapacityError, match="the cluster has 1"):
        check_capacity(sc, 2, wait=30)
    # The session's start time is the real clock's, a moment before the fake one's start.
    assert 30 - 1 < clock.waited() <= 30 + capacity.POLL_INTERVAL
    assert sc.slot_calls == len(clock.sleeps) + 1  # it polled until the deadline


def test_since_moves_the_start_of_the_wait() -> None:
    answers = iter([1, 1, 2])
    sc = FakeSc(slots=lambda: next(answers, 2), age=3600.0)
    check_capacity(sc, 2, wait=30, since=time.time())  # e.g. a restart after executors died
    assert sc.slot_calls == 3
    with pytest.raises(CapacityError):
        check_capacity(FakeSc(slots=1, age=0.0), 2, wait=30, since=time.time() - 60)


def test_busy_slots_sums_active_stages_and_skips_vanished_ones() -> None:
    assert busy_slots(FakeSc(busy=[2, 0, 5])) == 7
    assert busy_slots(FakeSc()) == 0


# --- total_slots fallback without resource profiles --------------------------------------------


@pytest.mark.parametrize(
    "master, parallelism, cpus, expected",
    [("local[4]", 4, "1", 4), ("local[*]", 8, "2", 4), ("local[4, 3]", 4, "1", 4)],
)
def test_total_slots_fallback_local(
    master: str, parallelism: int, cpus: str, expected: int
) -> None:
    sc = FakeSc(
        profiles=False,
        master=master,
        default_parallelism=parallelism,
        conf={"spark.task.cpus": cpus},
    )
    assert total_slots(sc) == expected


def test_total_slots_fallback_cluster() -> None:
    sc = FakeSc(
        profiles=False,
        master="spark://m:7077",
        conf={"spark.executor.cores": "4", "spark.task.cpus": "2"},
    )
    sc._jsc.sc().executors = 3 + 1  # the driver's block manager counts too
    assert total_slots(sc) == 6


def test_total_slots_prefers_the_resource_profile() -> None:
    sc = FakeSc(slots=5, master="local[2]", default_parallelism=2)
    assert total_slots(sc) == 5


def test_total_slots_fallback_plain_local_master() -> None:
    sc = FakeSc(profiles=False, master="local", default_parallelism=1)
    assert total_slots(sc) == 1


def test_no_slots_message_does_not_suggest_np_zero() -> None:
    with pytest.raises(CapacityError) as info:
        check_capacity(FakeSc(slots=0), 2, wait=30)
    assert "Lower np to 0" not in str(info.value)


def test_tasks_of_a_cancelled_job_still_ending_count_as_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cancelled job's stage is gone from the active stages, but its task still runs on
    # one executor until Spark has killed it: that slot is not free yet.
    sc = FakeSc(slots=2, busy=[])
    sc._jsc.sc().running = [1, 0]
    assert busy_slots(sc) == 1
    calls = {"n": 0}

    def task_ends(seconds: float) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            sc._jsc.sc().running = [0, 0]

    monkeypatch.setattr("sparktrain.driver.capacity.time.sleep", task_ends)
    check_capacity(sc, 2, wait=60)  # waits until the task has ended, then returns
    assert calls["n"] == 3 and busy_slots(sc) == 0


# --- the most the application could ever run: refused at once -----------------------------


@pytest.mark.parametrize(
    "master, conf, expected",
    [
        ("local-cluster[2,1,1024]", {}, 2),
        ("local-cluster[3, 4, 2048]", {"spark.task.cpus": "2"}, 6),
        (
            "local-cluster[2,1,1024]",
            {"spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1"},
            2,
        ),
        (
            "local-cluster[2,4,1024]",
            {"spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "0.5"},
            4,  # two tasks share each executor's one GPU
        ),
        ("local[3]", {}, 3),
        ("local", {}, 1),
        ("local[4, 2]", {"spark.task.cpus": "2"}, 2),
        ("yarn", {"spark.executor.instances": "4", "spark.executor.cores": "2"}, 8),
        (
            "k8s://https://h:6443",
            {"spark.executor.instances": "4", "spark.executor.cores": "2", "spark.cores.max": "5"},
            5,
        ),
        ("spark://m:7077", {"spark.cores.max": "6", "spark.task.cpus": "3"}, 2),
        ("spark://m:7077", {}, None),  # executors of unknown size: no bound
        ("yarn", {"spark.executor.instances": "4"}, None),  # cores per executor unknown
    ],
)
def test_most_slots(master: str, conf: dict[str, str], expected: int | None) -> None:
    found = capacity.most_slots(master, FakeConf(conf))
    assert (found[0] if found else None) == expected


def test_np_over_what_the_application_can_ever_hold_is_refused_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A session started just now, no executor registered yet, capacity_wait 60 s: np=3 on
    # local-cluster[2,1,1024] can never run, so there is nothing to wait for.
    def no_waiting(seconds: float) -> None:
        raise AssertionError("check_capacity waited for executors that cannot come")

    monkeypatch.setattr("sparktrain.driver.capacity.time.sleep", no_waiting)
    sc = FakeSc(slots=0, age=0.0, master="local-cluster[2,1,1024]")
    with pytest.raises(CapacityError) as info:
        check_capacity(sc, 3, wait=60)
    message = str(info.value)
    assert "np=3 needs 3 task slots at once" in message
    assert (
        "can never run more than 2 (local-cluster[2,1,1024]: 2 executor(s) x 1 core(s)" in message
    )
    assert "Lower np to 2 or less" in message and "spark.executor.instances" in message


def test_np_within_the_bound_still_waits_for_executors_to_register() -> None:
    answers = iter([0, 1, 2])
    sc = FakeSc(slots=lambda: next(answers, 2), age=0.0, master="local-cluster[2,1,1024]")
    check_capacity(sc, 2, wait=60)
    assert sc.slot_calls == 3


def test_executors_the_settings_promise_are_waited_for_however_old_the_session(
    caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    # On a busy host a new session can reach the caller more than capacity_wait after its
    # start time with one executor still registering (measured: 71 s beside 16 spinning
    # processes on 2 cores). Its settings give it 2 executors: the missing one is coming.
    answers = iter([1, 1, 1, 2])
    sc = FakeSc(slots=lambda: next(answers, 2), age=90.0, master="local-cluster[2,1,1024]")
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        check_capacity(sc, 2, wait=60)
    assert sc.slot_calls == 4 and clock.sleeps == [capacity.POLL_INTERVAL] * 3
    assert "the cluster has 1 so far; waiting up to 60s" in caplog.text


def test_each_executor_that_registers_starts_the_wait_again(clock: FakeClock) -> None:
    start = clock.now

    def registered() -> int:  # one executor 50 s in, the second 100 s in
        return sum(clock.now - start >= t for t in (50.0, 100.0))

    sc = FakeSc(slots=registered, age=0.0, master="local-cluster[2,1,1024]")
    check_capacity(sc, 2, wait=60)
    assert 100.0 <= clock.waited() < 100.0 + 2 * capacity.POLL_INTERVAL


def test_promised_executors_that_do_not_come_are_refused_saying_why(clock: FakeClock) -> None:
    sc = FakeSc(slots=1, age=90.0, master="local-cluster[2,1,1024]")
    with pytest.raises(CapacityError) as info:
        check_capacity(sc, 2, wait=60)
    assert 60.0 <= clock.waited() < 60.0 + 2 * capacity.POLL_INTERVAL  # from the run's start
    message = str(info.value)
    assert "np=2 needs 2 task slots at once (barrier mode)" in message
    assert "settings give it 2 (local-cluster[2,1,1024]: 2 executor(s) x 1 core(s)" in message
    assert "the cluster has 1 after waiting 60s" in message
    assert "still starting (a busy host can take minutes) or cannot start" in message
    assert "Raise capacity_wait (spark.sparktrain.capacityWait, now 60s)" in message
    assert message.endswith("or lower np to 1 or less.")


def test_a_restart_waits_from_when_the_executors_were_lost(clock: FakeClock) -> None:
    # since: the restart's own clock, which the settings' promise does not move.
    sc = FakeSc(slots=1, age=3600.0, master="local-cluster[2,1,1024]")
    with pytest.raises(CapacityError, match="but the cluster has 1 .spark.task.cpus=1"):
        check_capacity(sc, 2, wait=60, since=clock.now - 50.0)
    assert 10.0 <= clock.waited() < 10.0 + 2 * capacity.POLL_INTERVAL


def test_slots_held_by_other_runs_of_this_process_refuse_at_once() -> None:
    """Another run of this process holds 3 of 4 slots, its tasks not started by Spark yet (no
    busy stage): a run of np=2 cannot fit beside it, and is told so without waiting."""
    sc = FakeSc(slots=4)
    with pytest.raises(CapacityError) as info:
        check_capacity(sc, 2, wait=60.0, held=3)
    assert str(info.value) == (
        "np=2 needs 2 free task slots at once, but other runs of this process still going "
        "hold 3 of the cluster's 4 slots: wait for them (handle.result()), cancel one "
        "(handle.cancel()), or lower np to 1 or less"
    )
    check_capacity(sc, 1, wait=60.0, held=3)  # what is left fits
    check_capacity(FakeSc(slots=4, busy=[2]), 2, wait=60.0, held=2)  # their tasks, running


def test_slots_are_held_per_application_while_a_run_goes() -> None:
    from sparktrain.driver.inflight import held_by_others, reserve

    with reserve("app-1", 2) as first, reserve("app-1", 1) as second:
        assert first != second
        assert held_by_others("app-1", first) == 1
        assert held_by_others("app-1", second) == 2
        assert held_by_others("app-2", 0) == 0
        with reserve("app-1", 5, admitted=False):  # waiting in line holds nothing
            assert held_by_others("app-1", first) == 1
    assert held_by_others("app-1", 0) == 0


class Refused(Exception):
    """What the tests' ``refuse`` gives: the line it was refused in, and whether it waited."""


def _refuse(line: Any, waited: bool) -> Refused:
    return Refused(str(line), waited)


def _in_line(
    application: str,
    slots: int,
    total: int,
    wait: float | None = None,
    ticket: int | None = None,
    **kw: Any,
):
    """Take a place and wait for a turn in a thread; what it saw comes back in ``seen``."""
    import contextlib
    import threading

    from sparktrain.driver.inflight import next_ticket, reserve, take_turn

    seen: list[Any] = []
    turn = threading.Event()
    done = threading.Event()
    leave = threading.Event()
    if ticket is None:
        ticket = next_ticket()  # taken now, in this (the submitting) thread

    def go() -> None:
        with contextlib.ExitStack() as stack:
            token = stack.enter_context(reserve(application, slots, ticket, admitted=False))
            try:
                seen.append(
                    take_turn(
                        application,
                        token,
                        lambda: total,
                        wait,
                        _refuse,
                        on_wait=lambda line: seen.append(line and str(line)),
                        **kw,
                    )
                )
            except BaseException as exc:  # noqa: BLE001 - the test looks at it
                seen.append(exc)
                done.set()
                return
            turn.set()
            leave.wait(60)
        done.set()

    threading.Thread(target=go, daemon=True).start()
    return seen, turn, leave, done


def test_runs_that_do_not_fit_take_turns_in_the_order_they_came() -> None:
    """2 slots: a run of 1 holds one; a run of 2 waits; a later run of 1, which would fit
    beside the first, waits behind it (no overtaking); each starts when the one before leaves."""
    from tests.helpers import wait_for

    app = "app-turns"
    first, first_turn, first_leave, first_done = _in_line(app, 1, total=2)
    assert first_turn.wait(30) and first[-2:] == [None, 0]  # at once, nothing held beside it
    big, big_turn, big_leave, _ = _in_line(app, 2, total=2)
    wait_for(lambda: len(big) == 1, 30, "the run of 2 in line")
    small, small_turn, small_leave, _ = _in_line(app, 1, total=2)
    wait_for(lambda: len(small) == 1, 30, "the run of 1 in line")
    held = "(other runs of this process hold 1 of the cluster's 2)"
    assert big == [f"waiting for 2 task slots {held}, 1st in line"]
    assert small == [f"waiting for 1 task slot {held}, 2nd in line"]
    first_leave.set()
    assert big_turn.wait(30) and big[-2:] == [None, 0]
    # Now the run of 2 holds both: the run of 1 is first in line, and still waits.
    now = "waiting for 1 task slot (other runs of this process hold 2 of the cluster's 2), 1st in line"
    wait_for(lambda: small[-1] == now, 30, "the line to move up")
    assert not small_turn.is_set()
    big_leave.set()
    assert small_turn.wait(30) and small[-2:] == [None, 0]
    small_leave.set()
    assert first_done.wait(30)


def test_a_run_submitted_earlier_goes_first_however_late_its_thread(monkeypatch) -> None:
    """A submitted run's thread may reach the line after a run submitted later: the later one
    waits for it (no overtaking), and its place in line is right as soon as the first arrives
    (the line is told; nothing waits for the periodic recheck, made an hour here)."""
    from sparktrain.driver import inflight
    from tests.helpers import wait_for

    monkeypatch.setattr(inflight, "RECHECK", 3600.0)
    app = "app-late-thread"
    with inflight.reserve(app, 1):  # a run going holds 1 of the 2 slots
        early = inflight.next_ticket()
        inflight.expect(early)  # submitted; its thread has not taken its place yet
        later, later_turn, later_leave, _ = _in_line(app, 1, total=2)
        held = "(other runs of this process hold 1 of the cluster's 2)"
        wait_for(lambda: len(later) == 1, 30, "the later run in line")
        assert later == [f"waiting for 1 task slot {held}, 2nd in line"]
        # The early run arrives needing both slots: it waits first in line, the later run
        # (which would fit now) stays behind it.
        big, big_turn, big_leave, _ = _in_line(app, 2, total=2, ticket=early)
        wait_for(lambda: len(big) == 1, 30, "the early run in line")
        assert big == [f"waiting for 2 task slots {held}, 1st in line"]
        assert not later_turn.is_set() and later == [f"waiting for 1 task slot {held}, 2nd in line"]
    # The run going ends: the early run goes first, then the later one once it leaves.
    assert big_turn.wait(30) and big[-2:] == [None, 0]
    assert not later_turn.is_set()
    big_leave.set()
    assert later_turn.wait(30) and later[-2:] == [None, 0]
    later_leave.set()


def test_a_submitted_run_that_takes_no_place_holds_no_one_up(monkeypatch) -> None:
    """A run that ends (or needs no slots) before it takes its place lets the later go at once."""
    from sparktrain.driver import inflight

    monkeypatch.setattr(inflight, "RECHECK", 3600.0)
    app = "app-no-place"
    early = inflight.next_ticket()
    inflight.expect(early)
    later, later_turn, later_leave, _ = _in_line(app, 1, total=2)
    from tests.helpers import wait_for

    wait_for(lambda: len(later) == 1, 30, "the later run in line")
    assert later == [
        "waiting for 1 task slot (other runs of this process hold 0 of the cluster's 2), 2nd in line"
    ]
    inflight.forget(early)
    assert later_turn.wait(30) and later[-2:] == [None, 0]
    later_leave.set()


def test_queue_wait_zero_refuses_at_once_and_a_duration_after_waiting() -> None:
    from sparktrain.driver.inflight import reserve

    app = "app-refuse"
    with reserve(app, 2):  # another run holds both slots
        at_once, _, _, done = _in_line(app, 1, total=2, wait=0)
        assert done.wait(30)
        assert len(at_once) == 2 and at_once[0] is None  # never told it waits: refused first
        error = at_once[1]
        assert isinstance(error, Refused) and error.args == (
            "waiting for 1 task slot (other runs of this process hold 2 of the cluster's 2), "
            "1st in line",
            False,
        )
        later, _, _, done = _in_line(app, 1, total=2, wait=0.05)
        assert done.wait(30)
        assert isinstance(later[-1], Refused) and later[-1].args[1] is True  # it did wait
        assert later[0].endswith("1st in line")


def test_a_stop_takes_a_run_out_of_the_line() -> None:
    from concurrent.futures import CancelledError

    from sparktrain.driver.inflight import StopSignal, held_by_others, reserve
    from tests.helpers import wait_for

    app = "app-stop"
    stop = StopSignal()
    with reserve(app, 2) as holder:
        waiting, _, _, done = _in_line(app, 2, total=2, stop=stop)
        wait_for(lambda: len(waiting) == 1, 30, "the run in line")
        stop.request()
        assert done.wait(30)
        assert isinstance(waiting[-1], CancelledError)
        assert "cancelled while waiting for 2 task slots" in str(waiting[-1])
        assert held_by_others(app, holder) == 0


def test_a_run_the_cluster_could_never_hold_is_let_through_to_the_capacity_check() -> None:
    """np=3 where the settings give 2 slots, beside a run: waiting would never end; the
    capacity check says why."""
    from sparktrain.driver.inflight import reserve

    with reserve("app-never", 1):
        seen, turn, leave, _ = _in_line("app-never", 3, total=2, wait=None, most=2)
        assert turn.wait(30) and seen == [None, 1]
        leave.set()


def test_a_dip_in_the_live_slots_lets_no_run_overtake_the_others() -> None:
    """The settings give 2 slots and two runs hold them; an executor lost a moment makes the
    live count 1. A run of 2 waits its turn: it fits once the others end, so letting it
    through would only have it refused beside them."""
    from sparktrain.driver.inflight import reserve

    with reserve("app-dip", 2):
        seen, turn, leave, _ = _in_line("app-dip", 2, total=1, wait=None, most=2)
        from tests.helpers import wait_for

        wait_for(lambda: len(seen) == 1, 30, "the run in line")
        assert seen == [
            "waiting for 2 task slots (other runs of this process hold 2 of the "
            "cluster's 1), 1st in line"
        ]
        assert not turn.is_set()
    assert turn.wait(30) and seen[-2:] == [None, 0]  # alone now: its turn
    leave.set()


def test_places_in_line_read_as_ordinals() -> None:
    from sparktrain.driver.inflight import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
    ]
