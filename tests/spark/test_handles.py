"""Runs that do not block (``runner.submit`` and its handle) and the ``@distributed`` decorator,
on the driver (np < 0) and on Spark executors."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from sparktrain import CapacityError, RunHandle, SparkRunner, WorkerFailedError, distributed
from tests.fixtures import trainers
from tests.helpers import RANKS_START, alive, recorded_pids, settled_tracker, wait_for


def _ranks(mode: str, n: int) -> int:
    return n if mode == "spark" else -n


def _said(handle: RunHandle, text: str, ranks: int) -> bool:
    return sum(text in line for line in handle.logs()) >= ranks


def _active_jobs(spark: Any) -> list[int]:
    return list(settled_tracker(spark).getActiveJobsIds())


def _state(spark: Any, handles: list[RunHandle]) -> str:
    """What a wait that timed out found: each run's status and last lines, Spark's side."""

    def status(h: RunHandle) -> str:
        failed = h.done() and not h.cancelled() and h.exception() is not None
        why = f" ({type(h.exception()).__name__}: {h.exception()})" if failed else ""
        return f"{h.status()!r}{why} after {h.logs()[-3:]}"

    runs = "; ".join(status(h) for h in handles)
    from sparktrain.driver import inflight
    from sparktrain.driver.capacity import busy_slots, total_slots

    executors = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return (
        f"runs: {runs}; executors registered: {len(executors) - 1}; "
        f"slots: {total_slots(spark.sparkContext)}, busy: {busy_slots(spark.sparkContext)}; "
        f"active jobs: {_active_jobs(spark)}; places of this process's runs: "
        f"{inflight._places}, tickets on their way: {sorted(inflight._coming)}"
    )


def test_cancel_from_another_thread_while_ranks_block_in_a_collective(
    mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    handle = SparkRunner(np=_ranks(mode, 2), grace_period=1).submit(
        trainers.block_in_collective, str(tmp_path)
    )
    # The ranks' lines reach the handle while the run is going.
    wait_for(lambda: _said(handle, "in the collective", 2), 120, "both ranks' lines")
    assert not handle.done()
    assert sorted(handle.logs()) == [
        "[rank 0] rank 0 in the collective",
        "[rank 1] rank 1 in the collective",
    ]
    pids = recorded_pids(tmp_path)
    assert len(alive(pids)) == 2
    outcome: list[bool] = []
    canceller = threading.Thread(target=lambda: outcome.append(handle.cancel()))
    canceller.start()
    canceller.join(120)
    assert outcome == [True]
    assert handle.cancelled() and handle.done()
    with pytest.raises(concurrent.futures.CancelledError):
        handle.result()
    assert alive(pids) == []
    assert handle.last_run is not None
    assert handle.last_run.attempts[-1].cause == "cancelled; every rank was stopped."
    if mode == "spark":
        spark = request.getfixturevalue("spark")
        assert _active_jobs(spark) == []
    # The session (and the driver) still run a job.
    assert SparkRunner(np=_ranks(mode, 2)).run(trainers.noop) == 0


def test_ctrl_c_while_waiting_in_result_stops_the_run(tmp_path: Path) -> None:
    """A kernel interrupt (a real SIGINT to this process) while a cell waits in result()."""
    handle = SparkRunner(np=-2, grace_period=1).submit(trainers.block_forever, str(tmp_path))

    def press_ctrl_c() -> None:
        wait_for(lambda: len(recorded_pids(tmp_path)) == 2, 60, "both ranks")
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    with pytest.raises(KeyboardInterrupt):
        handle.result(120)
    presser.join(60)
    assert handle.cancelled()
    assert alive(recorded_pids(tmp_path)) == []


def test_a_failed_run_raises_from_result_what_run_raises(mode: str, tmp_path: Path) -> None:
    runner = SparkRunner(np=_ranks(mode, 2), grace_period=1)
    (tmp_path / "run").mkdir()
    (tmp_path / "submit").mkdir()
    with pytest.raises(WorkerFailedError) as blocking:
        runner.run(trainers.fail_on_rank, str(tmp_path / "run"), "raise")
    handle = runner.submit(trainers.fail_on_rank, str(tmp_path / "submit"), "raise")
    with pytest.raises(WorkerFailedError) as submitted:
        handle.result(120)
    assert handle.exception() is submitted.value
    # The same error: the root cause first (the rest names pids and times).
    for error in (blocking.value, submitted.value):
        assert error.root_cause.rank == 1
        assert "raised RuntimeError: injected failure on rank 1" in str(error).splitlines()[2]
    assert handle.last_run is not None and not handle.last_run.succeeded
    assert alive(recorded_pids(tmp_path / "submit")) == []


def test_runs_that_do_not_fit_wait_their_turn_in_order(spark: Any, tmp_path: Path) -> None:
    """The cluster has two slots: two runs of one rank go on together. A run of two waits its
    turn, and a later run of one that would fit sooner waits behind it (no overtaking); a run
    cancelled while in line leaves it; queue_wait=0 refuses at once instead of waiting."""
    release, release_third = tmp_path / "release", tmp_path / "release-third"
    handles: list[RunHandle] = []

    def submit(runner: SparkRunner, *args: Any) -> RunHandle:
        handles.append(runner.submit(*args))
        return handles[-1]

    from sparktrain.driver.capacity import total_slots

    # The premise: the cluster has two slots. An executor an earlier test lost is counted
    # until Spark hears it is gone, beside the one that replaced it.
    wait_for(
        lambda: total_slots(spark.sparkContext) == 2,
        RANKS_START,
        "the cluster's two slots",
        lambda: _state(spark, handles),
    )
    try:
        runner = SparkRunner(np=1)
        first = submit(runner, trainers.talk_until, str(release))
        second = submit(runner, trainers.talk_until, str(release))
        # Both ranks start on a session that earlier tests used: an executor they lost comes
        # back with a cold Python, so this waits as long as any run's ranks may take to start.
        wait_for(
            lambda: _said(first, "line 2", 1) and _said(second, "line 2", 1),
            RANKS_START,
            "both runs",
            lambda: _state(spark, handles),
        )
        assert first.status() == "running"

        hurried = submit(SparkRunner(np=1, queue_wait=0), trainers.noop)
        with pytest.raises(CapacityError) as refused:
            hurried.result(120)
        assert str(refused.value).startswith(
            "np=1 needs 1 free task slots at once, but other runs of this process still going "
            "hold 2 of the cluster's 2 slots, and queue_wait=0 refuses to wait for them "
            "(spark.sparktrain.queueWait)"
        )

        third = submit(SparkRunner(np=2), trainers.talk_until, str(release_third))
        cancelled = submit(runner, trainers.noop)
        fourth = submit(runner, trainers.noop)
        held = "(other runs of this process hold 2 of the cluster's 2)"
        # Each run's thread takes its place when it is ready (a later one may be first): the
        # line is whole once all three say where they are.
        line = [
            f"waiting for 2 task slots {held}, 1st in line",
            f"waiting for 1 task slot {held}, 2nd in line",
            f"waiting for 1 task slot {held}, 3rd in line",
        ]
        wait_for(
            lambda: [h.status() for h in (third, cancelled, fourth)] == line,
            120,
            "a line",
            lambda: _state(spark, handles),
        )
        assert (
            repr(third)
            == f"<RunHandle 'talk_until' waiting for 2 task slots {held}, 1st in line, 0 lines>"
        )
        assert cancelled.cancel() is True
        assert cancelled.cancelled() and cancelled.status() == "cancelled"
        with pytest.raises(concurrent.futures.CancelledError):
            cancelled.result()
        wait_for(lambda: fourth.status().endswith("2nd in line"), 60, "the line to move up")

        release.touch()
        assert [first.result(120), second.result(120)] == [0, 0]
        assert first.status() == "done" and first.last_run is not second.last_run
        assert first.tail(1) == ["[rank 0] released"]
        # The third runs once both have ended; the fourth, which would fit beside nothing less,
        # still waits behind it, now first in line.
        wait_for(lambda: _said(third, "line 2", 2), 120, "the third run's ranks")
        first_in_line = f"waiting for 1 task slot {held}, 1st in line"
        wait_for(lambda: fourth.status() == first_in_line, 60, "the fourth run first in line")
        release_third.touch()
        assert third.result(120) == 0 and fourth.result(120) == 0
        assert _active_jobs(spark) == []
    finally:
        # Whatever failed above, nothing of it may hold or wait for the shared session's
        # slots: the next tests' runs would wait in line behind it.
        release.touch()
        release_third.touch()
        for handle in handles:
            handle.cancel()
        for handle in handles:
            with contextlib.suppress(Exception):
                handle.result(120)


def test_follow_prints_the_lines_live_until_the_run_ends(tmp_path: Path) -> None:
    release = tmp_path / "release"
    handle = SparkRunner(np=-2).submit(trainers.talk_until, str(release), 2)
    wait_for(lambda: _said(handle, "line 1", 2), 60, "the first lines")
    seen: list[str] = []
    called: list[RunHandle] = []
    handle.add_done_callback(called.append)

    class Cell:
        def write(self, text: str) -> int:
            seen.append(text)
            if "line 1" in text and sum("line 1" in s for s in seen) == 2:
                release.touch()  # the rest comes after follow() started
            return len(text)

        def flush(self) -> None:
            pass

    handle.follow(last=100, out=Cell())  # type: ignore[arg-type]
    assert handle.done() and called == [handle]
    printed = [s for s in seen if s != "\n"]
    assert sorted(printed) == sorted(handle.logs())
    assert sum("released" in line for line in printed) == 2
    assert handle.result() == 0


def test_the_decorated_function_runs_plainly_here_and_on_every_rank(mode: str) -> None:
    where = distributed(np=_ranks(mode, 2))(trainers.whereabouts)
    assert where("here") == (0, 1, "here")  # ordinary Python, in this process
    assert where.__name__ == "whereabouts"
    assert where.distributed("there") == [(0, 2, "there"), (1, 2, "there")]
    later = distributed(np=_ranks(mode, 2), remote=True)(trainers.whereabouts)
    handle = later.distributed("later")
    assert isinstance(handle, RunHandle)
    assert handle.result(120) == [(0, 2, "later"), (1, 2, "later")]


def test_a_function_written_as_the_databricks_documentation_shows_it(spark: Any) -> None:
    # As Databricks' documentation writes it (only the import differs), but with gloo: these
    # machines have no GPU for NCCL.
    @distributed(gpus=2, gpu_type="H100")
    def run_train() -> dict[str, int]:
        import os

        import torch
        import torch.distributed as dist

        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        tensor = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(tensor)
        rank, world = dist.get_rank(), dist.get_world_size()
        dist.barrier()
        dist.destroy_process_group()
        return {"rank": rank, "local_rank": local_rank, "world": world, "sum": int(tensor.item())}

    results = run_train.distributed()
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["world"] for r in results} == {2} and {r["sum"] for r in results} == {3}


def test_decorator_settings_are_checked_when_decorating() -> None:
    from sparktrain import ConfigurationError

    with pytest.raises(ConfigurationError, match="give one of np=, gpus= or num_accelerators="):
        distributed(np=2, gpus=4)
    with pytest.raises(ConfigurationError, match="non-zero int"):
        distributed(num_accelerators=0)
    with pytest.raises(ConfigurationError, match="timeout"):
        distributed(np=2, timeout="soon")
    plain = distributed(np=-1)(os.path.join)
    assert plain("a", "b") == "a/b" and plain.runner.np == -1


@pytest.mark.slow
def test_the_notebook_trains_while_another_cell_computes(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = Path(__file__).resolve().parents[2] / "notebooks" / "runs_that_do_not_block.ipynb"
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "a code cell did not run"
    text = {c.source: "".join(o.get("text", "") for o in c.get("outputs", [])) for c in code}
    computing = next(t for source, t in text.items() if "primes" in source)
    assert "the run is going: True" in computing  # the run trains while this cell computes
    assert "[rank" not in computing  # and its lines stay out of this cell
    followed = text["handle.follow(last=4)"].splitlines()
    last = sorted(line.split(": loss")[0] for line in followed[-2:])
    assert last == ["[rank 0] epoch 19", "[rank 1] epoch 19"]  # followed to the end
    assert "'world_size': 2" in "".join(text.values())
    assert "[0, 1] from <RunHandle 'where' done" in list(text.values())[-1]
