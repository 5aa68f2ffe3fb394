"""Code written for TorchDistributor or horovod.spark.run, run as its users run it, on the
driver (np<0) and on local-cluster executors (np>0): scripts, the task's files, folders left
behind, extra mpirun arguments, a failed MPI rank, and np larger than the cluster."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from sparktrain import CapacityError, HorovodRunner, RunTimeoutError, SparkRunner, WorkerFailedError
from tests.conftest import ranks
from tests.fixtures import porting
from tests.helpers import timed_out_while_running, wait_for_files
from tests.spark.test_horovod_runner import _mpi_available

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "scripts" / "porting_train.py"


def _gone(folders: list[str], wait: float = 0.0) -> None:
    """None of the rank folders sparktrain made, nor any other of their runs, is left
    (within ``wait`` seconds, for tasks that end after run() has returned)."""
    assert folders
    # task-<run id>-<pid>, in the user's private folder
    prefixes = {(Path(f).parent, Path(f).name.rsplit("-", 1)[0]) for f in folders}
    deadline = time.monotonic() + wait
    while True:
        left = [str(p) for parent, prefix in prefixes for p in parent.glob(f"{prefix}-*")]
        left += [f for f in folders if Path(f).exists() and f not in left]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert not left, f"left behind: {left}"


def test_script_with_string_arguments_on_executors(spark, tmp_path):
    result = SparkRunner(np=2, spark=spark).run(str(SCRIPT), str(tmp_path), "0.01")
    assert result is None
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen["argv"] == [str(tmp_path), "0.01"] and seen["name"] == "__main__"
        assert seen["sum"] == 3.0
        assert not Path(seen["cwd"]).name.startswith("sparktrain-")


def test_files_and_archives_shipped_with_the_application_reach_the_ranks(spark, tmp_path):
    tag = uuid.uuid4().hex[:8]
    note = tmp_path / f"porting-note-{tag}.txt"
    note.write_text("a file from addFile")
    bundle = tmp_path / f"porting-bundle-{tag}.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("inner.txt", "a file inside addArchive's archive")
    spark.sparkContext.addFile(str(note))
    spark.sparkContext.addArchive(str(bundle))

    def task_cwd(_):
        import os

        yield os.getcwd()

    task_dirs = set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(task_cwd).collect())
    result = SparkRunner(np=2, spark=spark).run(porting.read_shipped, note.name, bundle.name)
    assert result["relative"] == result["via_spark_files"] == "a file from addFile"
    assert result["archive_relative"] == "a file inside addArchive's archive"
    assert result["archive_via_spark_files"] == "a file inside addArchive's archive"
    assert result["cwd"] in task_dirs  # the task's own working directory
    _gone([result["own_folder"]])


@pytest.mark.parametrize("how", ["raise", "kill", "timeout"])
def test_no_folder_is_left_after_a_failure_or_a_stop(mode, tmp_path, how):
    def attempt(folder: Path, timeout: float | None) -> list[dict[str, str]]:
        runner = SparkRunner(np=ranks(mode, 2), timeout=timeout, grace_period=2)
        error = RunTimeoutError if how == "timeout" else WorkerFailedError
        with pytest.raises(error) as info:
            runner.run(porting.note_folder_then, str(folder), how)
        if how == "raise":
            assert "RuntimeError: rank 1 gives up" in str(info.value)
        seen = [json.loads(p.read_text()) for p in sorted(folder.glob("folder-*.json"))]
        if seen:
            _gone([s["own_folder"] for s in seen])
        return seen

    if how == "timeout":  # once both ranks run (see timed_out_while_running)
        seen = timed_out_while_running(attempt, tmp_path, (10, 25, 60), pattern="folder-*.json")
    else:
        seen = attempt(tmp_path, None)
    assert len(seen) == 2
    assert all(Path(s["own_folder"]).parent not in Path(s["cwd"]).parents for s in seen)


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_no_folder_is_left_after_ctrl_c(mode, tmp_path, presses):
    # Once: every rank is stopped; twice: the run's Spark job is cancelled at once.
    def interrupt_when_started():
        wait_for_files(tmp_path, "folder-*.json", 2)
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        SparkRunner(np=ranks(mode, 2), grace_period=1).run(
            porting.note_folder_then, str(tmp_path), "hang"
        )
    seen = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("folder-*.json"))]
    # A cancelled Spark job ends its tasks asynchronously: their folders go when they do.
    _gone([s["own_folder"] for s in seen], wait=30.0)


def test_np_larger_than_the_cluster_can_ever_hold_is_refused(spark):
    with pytest.raises(CapacityError) as info:
        SparkRunner(np=3, spark=spark, start_timeout=5).run(porting.read_shipped, "x", "y")
    message = str(info.value)
    assert (
        "can never run more than 2 (local-cluster[2,1,1024]: 2 executor(s) x 1 core(s)" in message
    )
    assert "Lower np to 2 or less" in message


# -- horovod.spark.run users: extra_mpi_args, and a rank that fails under mpirun --------------


@pytest.fixture
def mpi() -> None:
    if not _mpi_available():
        pytest.skip("needs Open MPI's mpirun and Horovod built with MPI")


def test_extra_mpi_args_reach_mpirun(mode, mpi):
    runner = HorovodRunner(
        np=ranks(mode, 2),
        launcher="mpi",
        extra_mpi_args="-x PORTING_FLAG=from-mpirun --bind-to none",
    )
    assert runner.run(porting.mpi_env_and_exit, "PORTING_FLAG") == "from-mpirun"


def test_rank_exiting_under_mpirun_fails_the_run(mode, mpi, capsys):
    runner = HorovodRunner(np=ranks(mode, 2), launcher="mpi", driver_log_verbosity="all")
    with pytest.raises(WorkerFailedError) as info:
        runner.run(porting.mpi_env_and_exit, "UNSET", failing_rank=1)
    message = str(info.value)
    assert message.startswith("1 rank(s) failed. Root cause:")
    assert "rank 1 on" in message and "exited with code 1" in message
