"""The runner end to end, on the driver (np<0) and on local-cluster executors (np>0)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

import sparktrain
from sparktrain import (
    PayloadError,
    RendezvousTimeoutError,
    RunTimeoutError,
    SparkRunner,
    WorkerFailedError,
    wire,
)
from sparktrain.driver import controller
from tests.conftest import ranks
from tests.fixtures import trainers
from tests.helpers import (
    alive,
    interrupt_once_started,
    recorded_pids,
    settled_tracker,
    timed_out_while_running,
)


def test_returns_rank0_value_and_streams_logs(mode, capsys):
    result = SparkRunner(np=ranks(mode, 2)).run(trainers.whoami, tag="x")
    assert result["RANK"] == "0" and result["tag"] == "x"
    assert result["WORLD_SIZE"] == "2" and result["MASTER_PORT"]
    out = capsys.readouterr().out
    assert "[rank 0] hello from rank 0 x" in out
    assert "[rank 1] hello from rank 1 x" in out


def test_later_runs_fork_their_ranks_warm_each_in_its_own_place(mode, capsys):
    cold = SparkRunner(np=ranks(mode, 2), warm_start=False)
    fresh = cold.run(trainers.whoami, tag="cold")
    assert cold.last_run.attempts[-1].breakdown["forked"] is False
    runner = SparkRunner(np=ranks(mode, 2))
    for _ in range(40):  # real runs, until the zygote that loads beside them is ready
        warm = runner.run(trainers.whoami, tag="warm")
        if runner.last_run.attempts[-1].breakdown.get("forked"):
            break
    assert runner.last_run.attempts[-1].breakdown.get("forked"), "no run forked its ranks"
    place = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"]
    tuning = ["OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME"]
    assert {k: warm[k] for k in place + tuning} == {k: fresh[k] for k in place + tuning}
    assert bool(warm["CUDA_VISIBLE_DEVICES"]) == bool(fresh["CUDA_VISIBLE_DEVICES"])
    assert warm["pid"] != fresh["pid"]
    assert "[rank 1] hello from rank 1 warm" in capsys.readouterr().out


def test_allreduce_over_gloo(mode):
    assert SparkRunner(np=ranks(mode, 2)).run(trainers.allreduce_sum) == 3.0


def test_log_callback_only_shows_only_driver_messages(mode, capsys):
    def chatty():
        import sparktrain

        print("noise that stays on the worker", flush=True)
        sparktrain.log_to_driver(f"signal from {sparktrain.rank()}")
        return sparktrain.rank()

    result = SparkRunner(np=ranks(mode, 2), driver_log_verbosity="log_callback_only").run(chatty)
    out = capsys.readouterr().out
    assert result == 0
    assert "[rank 0] signal from 0" in out and "[rank 1] signal from 1" in out
    assert "noise" not in out


@pytest.mark.parametrize(
    "how, expected",
    [
        ("raise", "raised RuntimeError: injected failure on rank 1"),
        ("exit", "exited with code 3"),
        ("sigkill", "was killed by SIGKILL"),
    ],
)
def test_failed_rank_stops_everything(mode, how, expected, tmp_path):
    # No stopwatch: rank 0 blocks in an all_reduce whose own timeout (30 min) is far past the
    # test's time limit, so only the failure stopping it ends the test in time.
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=ranks(mode, 2), grace_period=2).run(
            trainers.fail_on_rank, str(tmp_path), how
        )
    error = info.value
    assert error.root_cause.rank == 1
    message = str(error)
    assert message.index("Root cause") < message.index("rank 1")
    assert expected in message
    if how == "raise":
        assert "Traceback" in message and "fail_on_rank" in message
    assert "about to fail" in message  # the last lines of the failed rank's output
    # Rank 0 was blocked in all_reduce; it was stopped, not left behind.
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


def test_spark_job_group_is_cancelled_on_failure(spark, tmp_path):
    with pytest.raises(WorkerFailedError):
        SparkRunner(np=2, grace_period=2).run(trainers.fail_on_rank, str(tmp_path), "raise")
    assert settled_tracker(spark).getActiveJobsIds() == []


def test_rank_that_never_reaches_rendezvous(mode):
    runner = SparkRunner(np=ranks(mode, 2), start_timeout=4)

    def hang_task_1(index: int) -> None:
        if index == 1:
            time.sleep(3600)  # past the test's time limit: the run must stop it, not wait

    runner._pre_rendezvous_hook = hang_task_1
    with pytest.raises(RendezvousTimeoutError) as info:
        runner.run(trainers.noop)
    assert info.value.missing == [1]
    assert "ranks [1] never reached the rendezvous" in str(info.value)
    assert "startTimeout" in str(info.value)


def test_run_timeout_stops_ranks(mode, tmp_path):
    # The timeout must fire once both ranks run, for this to show that running ranks are
    # stopped: a Spark task may need several seconds to start its Python on a busy machine,
    # so a run that timed out before both ranks had started is tried again with a longer one.
    def attempt(pid_dir: Path, timeout: float) -> RunTimeoutError:
        with pytest.raises(RunTimeoutError, match=f"timeout={timeout:g}s") as info:
            SparkRunner(np=ranks(mode, 2), timeout=timeout, grace_period=1).run(
                trainers.block_forever, str(pid_dir)
            )
        assert alive(recorded_pids(pid_dir)) == []
        return info.value

    short = 6 if mode == "local" else 8
    error = timed_out_while_running(attempt, tmp_path, (short, 20, 40, 80))
    # Where each rank was, from its own stack dump.
    lines = str(error).splitlines()
    for rank in (0, 1):
        assert any(
            line.startswith(f"  rank {rank}: in block_forever at trainers.py:")
            and line.endswith("time.sleep(600)")
            for line in lines
        ), str(error)


def test_keyboard_interrupt_stops_ranks(mode, tmp_path):
    interrupt_once_started(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        SparkRunner(np=ranks(mode, 2), grace_period=1).run(trainers.block_forever, str(tmp_path))
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


def test_ctrl_c_does_not_run_the_sessions_own_handler(mode, tmp_path):
    # PySpark's SparkContext installs a SIGINT handler that cancels every job of the session;
    # during run(), Ctrl-C must stop this run only (and the handler must be back afterwards).
    previous = signal.getsignal(signal.SIGINT)
    called: list[int] = []

    def session_handler(signum, frame):
        called.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, session_handler)
    try:
        interrupt_once_started(tmp_path)
        with pytest.raises(KeyboardInterrupt):
            SparkRunner(np=ranks(mode, 2), grace_period=1).run(
                trainers.block_forever, str(tmp_path)
            )
        assert called == []
        assert signal.getsignal(signal.SIGINT) is session_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert alive(recorded_pids(tmp_path)) == []


def test_unpicklable_capture_is_named_before_launch(mode, monkeypatch):
    lock = threading.Lock()
    launched = []

    def uses_lock():
        with lock:
            return 1

    # Launching goes through Attempts: the error must come before any attempt is made.
    monkeypatch.setattr(controller, "Attempts", lambda *a, **k: launched.append(a))
    with pytest.raises(PayloadError, match="'lock' captured by uses_lock"):
        SparkRunner(np=ranks(mode, 2)).run(uses_lock)
    assert launched == []


def test_spark_context_capture_is_named(spark):
    sc = spark.sparkContext

    def uses_sc():
        return sc.defaultParallelism

    with pytest.raises(PayloadError, match="'sc' captured by uses_sc.*SparkContext"):
        SparkRunner(np=2).run(uses_sc)


def test_unpicklable_result(mode):
    def returns_lock():
        import threading

        return threading.Lock()

    with pytest.raises(WorkerFailedError, match="cannot be pickled"):
        SparkRunner(np=ranks(mode, 2)).run(returns_lock)


def test_result_too_large(mode):
    def returns_big():
        return b"x" * 5000

    with pytest.raises(WorkerFailedError, match="over the limit"):
        SparkRunner(np=ranks(mode, 1), max_result_bytes=1000).run(returns_big)


def test_garbage_sent_to_the_channel_does_not_disturb_the_run(mode, capsys):
    def send_garbage_then_train():
        import os
        import random

        import sparktrain
        from sparktrain.wire import parse_address

        address = parse_address(os.environ["_SPARKTRAIN_CHANNEL"])
        rng = random.Random(sparktrain.rank())
        for size in (1, 7, 40, 4096):
            with socket.create_connection(address) as sock:
                sock.recv(16)
                sock.sendall(bytes(rng.getrandbits(8) for _ in range(size)))
        with socket.create_connection(address) as sock:  # a forged length header
            sock.recv(16)
            sock.sendall(b"SPT1\xff\xff\xff\xff" + b"\0" * 64)
        sparktrain.log_to_driver(f"still fine on {sparktrain.rank()}")
        return trainers.allreduce_sum()

    result = SparkRunner(np=ranks(mode, 2)).run(send_garbage_then_train)
    assert result == 3.0
    out = capsys.readouterr().out
    assert "[rank 0] still fine on 0" in out and "[rank 1] still fine on 1" in out


def files_holding(needles: list[bytes], roots: list[Path], since: float) -> list[Path]:
    """Regular files under ``roots`` written since ``since`` that contain any of ``needles``."""
    found = []
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                try:
                    info = path.lstat()
                    if not stat.S_ISREG(info.st_mode) or info.st_mtime < since:
                        continue
                    data = path.read_bytes()
                except OSError:
                    continue
                if any(needle in data for needle in needles):
                    found.append(path)
    return found


def test_the_key_is_not_written_to_disk_with_a_large_payload(spark, monkeypatch):
    keys: list[bytes] = []
    new_key = wire.new_key

    def recording_new_key() -> bytes:
        keys.append(new_key())
        return keys[-1]

    monkeypatch.setattr(wire, "new_key", recording_new_key)
    # Well over PySpark's 1 MiB threshold for turning a task's closure into a broadcast file.
    blob = os.urandom(6 << 20)

    def size(data: bytes) -> int:
        return len(data)

    since = time.time() - 1
    assert SparkRunner(np=2).run(size, blob) == len(blob)
    assert len(keys) == 1
    conf = spark.sparkContext.getConf()
    roots = [Path(tempfile.gettempdir()), Path(spark.sparkContext._temp_dir)]
    roots += [Path(d) for d in (conf.get("spark.local.dir") or "").split(",") if d]
    import pyspark

    roots.append(Path(pyspark.__file__).parent / "work")  # local-cluster executors' folders
    assert files_holding([keys[0], keys[0].hex().encode()], roots, since) == []


def test_ddp_trainer_pattern_learns_and_ranks_agree(mode):
    result = SparkRunner(np=ranks(mode, 2)).run(trainers.ddp_digits, epochs=3)
    losses = result["losses"]
    assert losses[-1] < losses[0] * 0.7, losses
    assert result["accuracy"] > 0.8
    first, second = result["params"]
    assert first == second  # DDP kept the replicas identical
    assert result["rank"] == 0


def test_default_backend_on_cpu(mode):
    def backend():
        import sparktrain

        return sparktrain.default_backend()

    assert SparkRunner(np=ranks(mode, 1)).run(backend) == "gloo"
    assert sparktrain.default_backend() == "gloo"


def test_user_env_reaches_ranks_and_wins_over_defaults(mode):
    def read_env():
        import os

        return os.environ.get("MY_SETTING"), os.environ["OMP_NUM_THREADS"]

    runner = SparkRunner(np=ranks(mode, 1), env={"MY_SETTING": "on", "OMP_NUM_THREADS": "3"})
    assert runner.run(read_env) == ("on", "3")


def test_reports_show_progress_and_come_back_as_rows(mode, capsys):
    def reports_epochs() -> str:
        import sparktrain

        for epoch in range(3):
            sparktrain.report(epoch=epoch, loss=1.0 / (epoch + 1), accuracy=0.5 + epoch / 10)
        return "done"

    runner = SparkRunner(np=ranks(mode, 2), total_epochs=3)
    assert runner.run(reports_epochs) == "done"
    captured = capsys.readouterr()
    assert "3/3 epochs" in captured.err + captured.out
    frame = runner.last_run.frame().query("rank == 0")
    assert list(frame["epoch"]) == [0, 1, 2] and set(runner.last_run.frame()["rank"]) == {0, 1}
    assert list(frame["loss"]) == pytest.approx([1.0, 0.5, 1 / 3])
    assert [m["metrics"]["accuracy"] for m in runner.history if m["rank"] == 0] == [
        pytest.approx(0.5),
        pytest.approx(0.6),
        pytest.approx(0.7),
    ]


def test_local_use_gpu_without_gpus_is_a_configuration_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(sparktrain.ConfigurationError, match="needs 2 GPUs on the driver, found 0"):
        SparkRunner(np=-2, use_gpu=True).run(trainers.noop)


def test_node_task_gives_each_task_torchdistributors_view(spark):
    # Two executors on one host, one fake GPU each ("0" and "1"): with node="task" each task
    # is a node of its own, in torchrun's variables and in Horovod's API alike.
    views = sparktrain.HorovodRunner(np=2, horovod_impl="builtin", node="task").run(
        trainers.node_view
    )
    assert [v["RANK"] for v in views] == ["0", "1"]
    assert [v["LOCAL_RANK"] for v in views] == ["0", "0"]
    assert [v["LOCAL_WORLD_SIZE"] for v in views] == ["1", "1"]
    assert [v["NODE_RANK"] for v in views] == [v["GROUP_RANK"] for v in views] == ["0", "1"]
    assert [v["GROUP_WORLD_SIZE"] for v in views] == ["2", "2"]
    assert [v["ROLE_RANK"] for v in views] == ["0", "1"]
    assert {v["ROLE_NAME"] for v in views} == {"default"}
    assert {v["ROLE_WORLD_SIZE"] for v in views} == {"2"}
    # One run id on every rank (what torch and Lightning look for), the first attempt.
    assert len({v["TORCHELASTIC_RUN_ID"] for v in views}) == 1 and views[0]["TORCHELASTIC_RUN_ID"]
    assert [v["TORCHELASTIC_RESTART_COUNT"] for v in views] == ["0", "0"]
    assert [v["TORCHELASTIC_MAX_RESTARTS"] for v in views] == ["0", "0"]
    assert all(v["torchelastic"] for v in views)
    # hvd: [rank, local_rank, local_size, cross_rank, cross_size].
    assert [v["hvd"] for v in views] == [[0, 0, 1, 0, 2], [1, 0, 1, 1, 2]]
    # Each rank sees its own task's GPU alone: cuda:{LOCAL_RANK} and the worker's pin are it.
    visible = [v["CUDA_VISIBLE_DEVICES"].split(",") for v in views]
    assert [len(gpus) for gpus in visible] == [1, 1] and visible[0] != visible[1]
    assert [v["_SPARKTRAIN_DEVICE_INDEX"] for v in views] == ["0", "0"]
    # One host: files written on it are shared by both (a local checkpoint folder is fine).
    assert [v["_SPARKTRAIN_NUM_HOSTS"] for v in views] == ["1", "1"]
