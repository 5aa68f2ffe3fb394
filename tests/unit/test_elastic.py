"""Elastic runs (np=(min, max)): the forms refused, the size of each attempt, when a run grows
back, and what the record and the log say; against fake capacity and a fake clock."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sparktrain import SparkRunner, distributed
from sparktrain.commands.cli import build_parser
from sparktrain.config import RunConfig
from sparktrain.driver import capacity, elastic
from sparktrain.driver.attempts import Attempts
from sparktrain.driver.elastic import GrowWatch, ResizeStop, choose_size, fitting_size
from sparktrain.driver.places.classic import ClassicPlace
from sparktrain.driver.progress import Progress
from sparktrain.driver.run_record import RunRecord
from sparktrain.errors import (
    CapacityError,
    ConfigurationError,
    SparkTrainError,
    WorkerFailedError,
    WorkerFailure,
)
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.task.assignment import TaskJob


class FakeClock:
    """``time.monotonic`` that ``sleep`` moves on at once; the sleeps are logged."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Cluster:
    """The capacity functions elastic reads: total slots and busy ones, changed by tests."""

    def __init__(self, total: int, busy: int = 0) -> None:
        self.total, self.busy = total, busy
        self.waits: list[tuple[int, float, float | None]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Cluster:
        monkeypatch.setattr(capacity, "total_slots", lambda sc: self.total)
        monkeypatch.setattr(capacity, "busy_slots", lambda sc: self.busy)
        monkeypatch.setattr(capacity, "check_capacity", self.check)
        return self

    def check(self, sc: Any, n: int, wait: float, since: float | None = None, **kw: Any) -> None:
        """check_capacity's contract: return once n slots are free, else CapacityError."""
        self.waits.append((n, wait, since))
        if self.total - self.busy < n:
            raise CapacityError(f"np={n} needs {n} task slots at once, but the cluster has 1")


# -- the forms of np ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "np, words",
    [
        ((-4, -2), "ranks on the driver (a negative np) are not elastic"),
        ((-4, -2), "use np=-4 for a fixed number on the driver"),
        ((3, 2), "min is larger than its max: write np=(2, 3)"),
        ((0, 2), "min must be at least 1"),
        ((1, 2, 3), "two positive ints, min <= max"),
        ((1.5, 2), "which is not two ints"),
        ((True, 2), "which is not two ints"),
        ([], "got np=[]"),
    ],
)
def test_bad_elastic_forms_are_refused_naming_the_form(np, words):
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=np)
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_elastic_with_mpirun_is_refused_naming_gloo():
    with pytest.raises(ConfigurationError, match=r"launcher='mpi' is not.*launcher='gloo'"):
        SparkRunner(np=(2, 4), backend="horovod", launcher="mpi")


def test_elastic_settings_are_checked_and_read_from_spark_conf():
    with pytest.raises(
        ConfigurationError, match=r"elastic_grow must be True or False.*elasticGrow"
    ):
        RunConfig.resolve((1, 2), {"elastic_grow": "maybe"})
    with pytest.raises(ConfigurationError, match="resize_interval must be a positive"):
        RunConfig.resolve((1, 2), {"resize_interval": 0})
    conf = {
        "spark.sparktrain.resizeInterval": "5m",
        "spark.sparktrain.elasticGrow": "false",
    }
    config = RunConfig.resolve((1, 4), spark_conf=conf)
    assert (config.resize_interval, config.elastic_grow) == (300.0, False)
    assert RunConfig.resolve((1, 4)).resize_interval == 60.0  # the default


def test_elastic_np_is_the_range_and_a_size_within_it_and_travels_to_tasks():
    config = RunConfig.resolve((1, 4))
    assert (config.np, config.world_size, config.elastic, config.local) == (4, 4, (1, 4), False)
    back = RunConfig.from_json(config.to_json())
    assert back == config and back.elastic == (1, 4)
    assert Attempts._sized(config, 2).world_size == 2
    assert Attempts._sized(config, 2).elastic == (1, 4)
    with pytest.raises(ConfigurationError, match=r"np=5 is outside its range \(1, 4\)"):
        Attempts._sized(config, 5)
    fixed = RunConfig.resolve(3)
    assert fixed.elastic is None and Attempts._sized(fixed, 3) is fixed


def test_the_elastic_field_is_not_a_keyword_setting():
    with pytest.raises(ConfigurationError, match="unknown setting 'elastic'"):
        RunConfig.resolve(2, {"elastic": (1, 2)})


def test_decorator_and_cli_take_the_range():
    fn = distributed(np=(1, 3))(lambda: None)
    assert fn.runner.config.elastic == (1, 3)
    with pytest.raises(ConfigurationError, match="not elastic"):
        distributed(np=(-2, -1))
    options = build_parser().parse_args(["run", "--np", "2:4", "train.py"])
    assert options.np == (2, 4)
    assert build_parser().parse_args(["run", "--np", "-2", "train.py"]).np == -2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--np", "2-4", "train.py"])


# -- the size of an attempt ------------------------------------------------------------------


@pytest.mark.parametrize(
    "free, low, high, k, size",
    [
        (2, 1, 4, 1, 2),  # max does not fit: as many as fit
        (9, 1, 4, 1, 4),  # more free than max: max
        (0, 1, 4, 1, None),  # below min
        (1, 2, 4, 1, None),
        (3, 2, 8, 2, 6),  # whole tasks of 2 ranks
        (3, 2, 5, 2, 4),  # max 5 with 2 per task: 2 tasks
        (-1, 1, 2, 1, None),  # more busy than the cluster has (a lost executor's tasks)
    ],
)
def test_fitting_size_is_the_largest_that_fits(free, low, high, k, size):
    assert fitting_size(free, low, high, k) == size


def test_a_range_without_a_multiple_of_the_ranks_per_task_is_refused():
    config = RunConfig.resolve((3, 3))
    with pytest.raises(ConfigurationError, match=r"np=\(3, 3\) holds no multiple of .*=2"):
        elastic.smallest(config, 2)
    assert elastic.smallest(RunConfig.resolve((3, 8)), 2) == 4


def test_starts_with_the_slots_free_now_without_waiting(monkeypatch):
    cluster = Cluster(total=2).install(monkeypatch)
    clock = FakeClock()
    monkeypatch.setattr(elastic.time, "sleep", clock.sleep)
    assert choose_size(object(), RunConfig.resolve((1, 4)), 1, held=0, since=None) == 2
    assert cluster.waits == [] and clock.sleeps == []
    cluster.busy = 1  # another job's task
    assert choose_size(object(), RunConfig.resolve((1, 4)), 1, held=0, since=None) == 1
    cluster.busy, cluster.total = 0, 1
    # Other runs of this process hold slots not running yet: they count as busy.
    assert choose_size(object(), RunConfig.resolve((1, 4)), 1, held=0, since=None) == 1


def test_below_min_waits_for_min_as_a_fixed_size_waits_and_fails_with_its_message(monkeypatch):
    cluster = Cluster(total=1).install(monkeypatch)
    config = RunConfig.resolve((2, 4), {"capacity_wait": 7})
    with pytest.raises(CapacityError, match="the cluster has 1"):
        choose_size(object(), config, 1, held=0, since=None)
    assert cluster.waits == [(2, 7.0, None)]  # waited for min, with capacity_wait


def test_a_restart_counts_slots_once_its_own_stopped_tasks_have_ended(monkeypatch):
    cluster = Cluster(total=3, busy=2).install(monkeypatch)
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 3:  # the cancelled attempt's tasks end
            cluster.busy = 0

    monkeypatch.setattr(elastic.time, "sleep", sleep)
    monkeypatch.setattr(elastic.time, "monotonic", clock)
    assert choose_size(object(), RunConfig.resolve((1, 4)), 1, held=0, since=5.0) == 3
    assert clock.sleeps == [capacity.POLL_INTERVAL] * 3


# -- growing back ---------------------------------------------------------------------------


def test_grow_looks_at_most_every_interval_and_only_at_a_save():
    clock = FakeClock()
    free = [0]
    looks: list[float] = []

    def slots() -> int:
        looks.append(clock.now)
        return free[0]

    watch = GrowWatch(size=2, high=4, ranks_per_task=1, interval=60, free=slots, clock=clock)
    clock.now += 59
    assert watch.on_saved(1) is None and looks == []  # too soon after the attempt began
    clock.now += 1
    assert watch.on_saved(2) is None and looks == [1060.0]  # looked: nothing free
    free[0] = 5
    clock.now += 30
    assert watch.on_saved(3) is None and looks == [1060.0]  # slots free, but too soon
    clock.now += 30
    stop = watch.on_saved(4)
    assert isinstance(stop, ResizeStop) and stop.size == 4  # capped at max
    assert "grow from 2 to 4 ranks" in stop.reason and "checkpoint step 4" in stop.reason


def test_grow_in_whole_tasks_and_never_at_max():
    clock = FakeClock()
    watch = GrowWatch(size=2, high=7, ranks_per_task=2, interval=1, free=lambda: 1, clock=clock)
    clock.now += 1
    stop = watch.on_saved(0)
    assert stop is not None and stop.size == 4
    at_max = GrowWatch(size=4, high=4, ranks_per_task=1, interval=1, free=lambda: 9, clock=clock)
    clock.now += 5
    assert at_max.on_saved(0) is None


def test_no_grow_watch_for_fixed_runs_at_max_or_when_turned_off():
    config = RunConfig.resolve((1, 4))
    assert elastic.grow_watch(object(), config, 2, 1, lambda: 0) is not None
    assert elastic.grow_watch(object(), config, 4, 1, lambda: 0) is None
    off = RunConfig.resolve((1, 4), {"elastic_grow": False})
    assert elastic.grow_watch(object(), off, 2, 1, lambda: 0) is None
    assert elastic.grow_watch(object(), RunConfig.resolve(2), 2, 1, lambda: 0) is None


# -- the attempts of an elastic run ---------------------------------------------------------


class Context:
    """A SparkContext whose settings bound nothing (its slots are the tests' to say)."""

    master = "spark://test:7077"

    def getConf(self) -> dict[str, str]:  # noqa: N802 - Spark's name
        return {}


class Session:
    sparkContext: Any = Context()


def run_attempts(config: RunConfig) -> Attempts:
    job = TaskJob(run_id="r1", attempt=0, config=config.to_json(), channel="", key=b"", payload=b"")
    progress = Progress(display=False)
    return Attempts(ClassicPlace(Session()), config, job, "train", RunRecord(), progress, None)


def lost(rank: int) -> WorkerFailedError:
    return WorkerFailedError(
        {
            rank: WorkerFailure(
                rank=rank, host="10.0.0.12", phase="lost", message="its task vanished"
            )
        }
    )


def script(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, steps: list[Any]) -> list[TaskJob]:
    """Each attempt does the next step: an exception to raise, a number of slots the cluster
    then has, or a value to return; returns the jobs the attempts were given."""
    jobs: list[TaskJob] = []

    def attempt(self: Attempts, job: TaskJob, record: Any) -> list[RankOutcome]:
        jobs.append(job)
        outcome, total = steps[len(jobs) - 1]
        cluster.total = total
        if isinstance(outcome, BaseException):
            raise outcome
        return [RankOutcome(0, 0, RankStatus.OK)]

    monkeypatch.setattr(Attempts, "_attempt", attempt)
    monkeypatch.setattr("sparktrain.driver.attempts.rank0_result", lambda records, name: "done")
    return jobs


def test_shrinks_after_a_loss_grows_back_and_a_resize_is_not_a_restart(monkeypatch, caplog):
    cluster = Cluster(total=4).install(monkeypatch)
    jobs = script(
        monkeypatch,
        cluster,
        [
            (lost(3), 2),  # a host of 2 slots is lost
            (ResizeStop(4, "grow from 2 to 4 ranks: task slots became free"), 4),
            (None, 4),
        ],
    )
    run = run_attempts(RunConfig.resolve((2, 4), {"max_restarts": 1}))
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        assert run.run() == "done"
    record = run.record
    assert record.sizes == [4, 2, 4] and record.elastic == (2, 4)
    assert [a.resized for a in record.attempts] == [False, True, False]
    assert "rank 3" in record.attempts[0].cause
    assert record.attempts[1].cause == "grow from 2 to 4 ranks: task slots became free"
    assert "restart 1/1 after: rank 3" in record.attempts[1].size_reason
    assert record.attempts[2].size_reason == record.attempts[1].cause
    # What each attempt's tasks were given: its size, and the size before it.
    assert [j.run_config.world_size for j in jobs] == [4, 2, 4]
    assert [j.previous_world_size for j in jobs] == [4, 4, 2]
    assert [j.attempt for j in jobs] == [0, 1, 2]
    assert cluster.waits == []  # never waited: each size fitted when it was chosen
    text = record.describe()
    assert "attempt 2 on 2 ranks: resized: grow from 2 to 4" in text
    assert "attempt 3 on 4 ranks: ok" in text
    assert "elastic run np=(2, 4): 2 ranks (was 4): restart 1/1" in caplog.text
    assert "elastic run np=(2, 4): 4 ranks (was 2): grow from 2 to 4" in caplog.text
    assert run.progress.ranks == 4


def test_a_second_loss_after_a_resize_exceeds_max_restarts(monkeypatch):
    cluster = Cluster(total=4).install(monkeypatch)
    script(
        monkeypatch,
        cluster,
        [(lost(3), 2), (ResizeStop(4, "grow"), 4), (lost(1), 4)],
    )
    run = run_attempts(RunConfig.resolve((2, 4), {"max_restarts": 1}))
    with pytest.raises(WorkerFailedError, match="rank 1"):
        run.run()
    assert run.record.sizes == [4, 2, 4]


def test_a_restart_below_min_fails_after_capacity_wait_saying_what_was_lost(monkeypatch):
    cluster = Cluster(total=4).install(monkeypatch)
    script(monkeypatch, cluster, [(lost(3), 1)])
    run = run_attempts(RunConfig.resolve((2, 4), {"max_restarts": 1, "capacity_wait": 9}))
    with pytest.raises(CapacityError) as info:
        run.run()
    assert "did not come back within capacity_wait=9s" in str(info.value)
    assert "the cluster has 1" in str(info.value)
    assert cluster.waits and cluster.waits[0][:2] == (2, 9.0) and cluster.waits[0][2] is not None
    assert run.record.sizes == [4]  # the restart never launched


def test_fixed_runs_record_their_size_without_an_elastic_reason(monkeypatch):
    cluster = Cluster(total=4).install(monkeypatch)
    script(monkeypatch, cluster, [(None, 4)])
    run = run_attempts(RunConfig.resolve(3))
    assert run.run() == "done"
    assert run.record.sizes == [3] and run.record.attempts[0].size_reason is None
    assert run.record.elastic is None and run.progress.ranks is None
    assert cluster.waits == [(3, 60.0, None)]  # the fixed size's own capacity check


def test_the_progress_display_shows_the_attempts_size():
    import io

    out = io.StringIO()
    progress = Progress(total=3, unit="epoch", file=out)
    progress.set_ranks(2)
    progress.on_report({"type": "report", "rank": 0, "epoch": 0, "step": 5, "metrics": {}})
    progress.close()
    assert "ranks=2" in out.getvalue()
    fixed = io.StringIO()
    unsized = Progress(total=3, unit="epoch", file=fixed)
    unsized.on_report({"type": "report", "rank": 0, "epoch": 0, "step": 5, "metrics": {}})
    unsized.close()
    assert "ranks=" not in fixed.getvalue() and "epoch=0" in fixed.getvalue()


def test_rank_0s_save_tells_the_driver_and_only_it_can_stop_the_run_to_grow(monkeypatch, tmp_path):
    from sparktrain import checkpoint
    from sparktrain.driver.monitor import RunMonitor
    from sparktrain.wire import protocol
    from sparktrain.worker import context

    sent: list[RankOutcome] = []
    monkeypatch.setattr(context, "_send", lambda message: sent.append(message) or True)
    checkpoint.save({"w": 1}, tmp_path / "ckpt", step=7)
    assert sent == [protocol.SAVED(rank=0, step=7)]

    asked: list[int] = []
    stop = ResizeStop(4, "grow from 2 to 4 ranks")
    monitor = RunMonitor(
        RunConfig(np=2), server=Any, on_saved=lambda step: asked.append(step) or stop
    )
    assert monitor._handle(1, protocol.SAVED(rank=1, step=3)) is None and asked == []
    assert monitor._handle(1, protocol.SAVED(rank=0, step=4)) is stop and asked == [4]
    monitor.stop_reason = "rank 1 failed"  # already stopping for another reason
    assert monitor._handle(1, protocol.SAVED(rank=0, step=5)) is None and asked == [4]


def test_a_stop_to_grow_keeps_no_result_and_warns_of_none(caplog):
    """Stopped to grow, the run returns the larger attempt's value: what rank 0 returned as
    it stopped is neither kept nor announced as 'the run returns no value'."""
    from sparktrain.driver.monitor import RunMonitor

    def concluded(stop_error: Exception) -> tuple[BaseException, list[str]]:
        monitor = RunMonitor(RunConfig(np=2), server=Any, kept_name="grow-attempt1-rank0")
        kept: list[str] = []
        monitor.results.keep = lambda rank_of, name: kept.append(name) or " (kept)"
        monitor.stop_error = stop_error
        with pytest.raises(type(stop_error)) as raised:
            monitor._conclude({"records": [], "error": None}, launch=Any)
        return raised.value, kept

    caplog.set_level("WARNING")
    grow = ResizeStop(4, "grow from 2 to 4 ranks")
    assert concluded(grow) == (grow, [])
    assert "returns no value" not in caplog.text
    cancelled = SparkTrainError("cancelled")
    assert concluded(cancelled) == (cancelled, ["grow-attempt1-rank0"])
    assert "the run returns no value (kept)" in caplog.text


def test_ranks_stopped_to_grow_leave_no_kept_result_and_no_warning(tmp_path, monkeypatch, caplog):
    """The real monitor against scripted tasks that send results as real tasks do: rank 0
    saves, the run stops to grow, and each rank returns at should_stop() with a value, as the
    guide's loop does. That value is nobody's result: the run goes on larger and returns
    the larger attempt's, so the driver neither keeps it in a file nor warns of it."""
    import tempfile
    import threading

    from sparktrain import wire
    from sparktrain.driver.channel import ChannelServer
    from sparktrain.driver.monitor import RunMonitor
    from sparktrain.shipping.payload import dump_result
    from sparktrain.task import result_upload
    from sparktrain.task.driver_link import TaskSession
    from sparktrain.wire import protocol
    from tests.unit.test_all_results import _relay
    from tests.unit.test_monitor import FakeLaunch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where kept results would go
    config = RunConfig(np=2, grace_period=1)
    stop = ResizeStop(4, "grow from 2 to 4 ranks: task slots became free")
    asked: list[int] = []
    sent: list[RankOutcome] = []
    with ChannelServer(wire.new_key()) as server:
        job = TaskJob("grow", 1, config.to_json(), server.address, server.key, b"")

        def body(tasks, done) -> None:
            for task in tasks:
                task.hello()
            for rank, task in enumerate(tasks):
                task.started(rank)
            tasks[0].client.send(protocol.SAVED(rank=0, step=3))
            assert all(task.aborted.wait(10) for task in tasks)
            records = []
            for rank, task in enumerate(tasks):
                session = TaskSession(job, task.client)
                threading.Thread(target=_relay, args=(task, session), daemon=True).start()
                value = dump_result({"stopped": 3}, 1 << 20, rank)
                mine = RankOutcome(rank, rank, RankStatus.OK, value)
                records += result_upload.deliver(session, [mine], "host-a")
            sent.extend(records)
            for task in tasks:
                task.exited()
            done([r.to_json() for r in records], None)

        monitor = RunMonitor(
            config,
            server,
            kept_name="grow-attempt2-rank0",
            on_saved=lambda step: asked.append(step) or stop,
        )
        with caplog.at_level(logging.WARNING, logger="sparktrain"), pytest.raises(ResizeStop):
            monitor.watch(FakeLaunch(server, 2, body))
    assert asked == [3] and monitor.stop_error is stop
    # Both values reached the driver (sent, not carried): there was something to keep.
    assert [(r.result_sent or 0) > 0 for r in sent] == [True, True]
    assert "returns no value" not in caplog.text
    assert [p.name for p in tmp_path.rglob("*.pkl")] == []
