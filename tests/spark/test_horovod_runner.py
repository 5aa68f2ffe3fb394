"""HorovodRunner end to end: the Databricks tutorial, Horovod's view of the ranks, and the
same failure, timeout and log behaviour as the torch backend, with Gloo and with mpirun, on
the driver (np<0) and on local-cluster executors (np>0)."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import time
from pathlib import Path

import pytest

from sparktrain import HorovodRunner, RendezvousTimeoutError, RunTimeoutError, WorkerFailedError
from sparktrain.backends.horovod_install import _links_mpi, horovod_torch_library
from tests.conftest import ranks
from tests.fixtures import hvd_trainers
from tests.helpers import alive, recorded_pids, timed_out_while_running

_LIBRARY = horovod_torch_library()
_MPI_MISSING = (
    "Horovod's MPI launcher needs Open MPI's mpirun and Horovod built with MPI "
    "(apt-get install openmpi-bin libopenmpi-dev; HOROVOD_FORCE=1 scripts/install-horovod.sh)"
)

pytestmark = [
    pytest.mark.horovod,
    pytest.mark.skipif(
        _LIBRARY is None or importlib.util.find_spec("horovod") is None,
        reason="horovod.torch is not importable: build it with scripts/install-horovod.sh",
    ),
]


def _mpi_available() -> bool:
    return _LIBRARY is not None and shutil.which("mpirun") is not None and _links_mpi(_LIBRARY)


@pytest.fixture(params=["gloo", "mpi"])
def launcher(request: pytest.FixtureRequest) -> str:
    """How ranks are started: Horovod's Gloo rendezvous, or mpirun (skipped without MPI)."""
    if request.param == "mpi" and not _mpi_available():
        pytest.skip(_MPI_MISSING)
    return str(request.param)


@pytest.fixture
def mpi() -> None:
    if not _mpi_available():
        pytest.skip(_MPI_MISSING)


# -- Part A: the tutorial and the workshop -------------------------------------------------


def test_train_hvd_tutorial_loss_falls(mode, launcher, tmp_path):
    start = time.monotonic()
    result = HorovodRunner(np=ranks(mode, 2), launcher=launcher).run(
        hvd_trainers.train_hvd, learning_rate=0.1, num_epochs=3, checkpoint_dir=str(tmp_path)
    )
    elapsed = time.monotonic() - start
    losses = result["losses"]
    assert result["rank"] == 0 and result["size"] == 2
    assert losses[-1] < losses[0] * 0.8, losses
    # One checkpoint per epoch, each written by rank 0 only.
    import torch

    checkpoints = sorted(tmp_path.glob("checkpoint-*.pth.tar"))
    assert [p.name for p in checkpoints] == [f"checkpoint-{e}.pth.tar" for e in (1, 2, 3)]
    assert {torch.load(p, weights_only=False)["rank"] for p in checkpoints} == {0}
    print(f"train_hvd ({mode}, {launcher}): {elapsed:.1f}s, losses {losses}")


def test_workshop_metric_average_broadcast_state_fp16(mode):
    result = HorovodRunner(np=ranks(mode, 2)).run(hvd_trainers.workshop_steps)
    seen = result["ranks"]
    assert result["size"] == 2 and [s["rank"] for s in seen] == [0, 1]
    assert result["compression"] == "FP16Compressor"
    assert all(s["avg"] == 1.5 for s in seen)  # (1 + 2) / 2 through hvd.allreduce
    assert all(s["lr"] == 0.01 for s in seen)  # rank 0's learning rate was broadcast
    assert seen[0]["momentum"] == seen[1]["momentum"]  # and its momentum buffers
    # Averaged (fp16-compressed) gradients from one starting point: identical replicas.
    assert seen[0]["params"] == pytest.approx(seen[1]["params"], abs=1e-6)


def test_horovod_ranks_match_sparktrain(mode, launcher):
    seen = HorovodRunner(np=ranks(mode, 2), launcher=launcher).run(hvd_trainers.places)
    assert [p["rank"] for p in seen] == [0, 1]
    for place in seen:
        assert place["rank"] == place["env_rank"]
        assert place["size"] == place["env_world_size"] == 2
        assert place["local_rank"] == place["env_local_rank"] == place["rank"]  # one host
        assert (place["local_size"], place["cross_rank"], place["cross_size"]) == (2, 0, 1)


def test_each_rank_pins_its_own_gpu(mode, launcher, tmp_path, monkeypatch):
    runner = HorovodRunner(np=ranks(mode, 2), launcher=launcher)
    if mode == "spark":
        # Each executor has one fake GPU; the hook notes which one each task was given.
        runner._pre_rendezvous_hook = functools.partial(hvd_trainers.record_task_gpu, str(tmp_path))
        gpu_dir: str | None = str(tmp_path)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # the driver's GPUs, one per rank
        gpu_dir = None
    seen = runner.run(hvd_trainers.places, gpu_dir)
    own = [p["own_gpu"] for p in seen] if mode == "spark" else ["5", "7"]
    assert len(set(own)) == 2, own
    for place in seen:
        assert place["pinned"] == own[place["rank"]]
        assert place["device_index"] == str(place["local_rank"])
        assert place["visible"].split(",")[place["local_rank"]] == own[place["rank"]]


# -- failures, timeouts, logs: as for torch --------------------------------------------------


@pytest.mark.parametrize(
    "how, expected",
    [
        ("raise", "raised RuntimeError: injected failure on rank 1"),
        ("exit", "exited with code 3"),
        ("sigkill", "was killed by SIGKILL"),
    ],
)
def test_failed_rank_in_allreduce_loop_stops_everything(mode, launcher, how, expected, tmp_path):
    # No stopwatch: Horovod's allreduce that rank 1 never joins waits forever, so only the
    # failure stopping rank 0 ends the test within its time limit.
    with pytest.raises(WorkerFailedError) as info:
        HorovodRunner(np=ranks(mode, 2), launcher=launcher, grace_period=2).run(
            hvd_trainers.fail_in_allreduce_loop, str(tmp_path), how
        )
    error = info.value
    message = str(error)
    assert error.root_cause.rank == 1, message
    assert message.index("Root cause") < message.index("rank 1")
    assert expected in message
    if how == "raise":
        assert "Traceback" in message and "fail_in_allreduce_loop" in message
    assert "about to fail" in message  # the failed rank's last lines of output
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and alive(pids) == []


def test_rank_that_never_reaches_rendezvous(mode, launcher):
    runner = HorovodRunner(np=ranks(mode, 2), launcher=launcher, start_timeout=8, grace_period=1)

    def hang_task_1(index: int) -> None:
        if index == 1:
            time.sleep(3600)  # past the test's time limit: the run must stop it, not wait

    runner._pre_rendezvous_hook = hang_task_1
    with pytest.raises(RendezvousTimeoutError) as info:
        runner.run(hvd_trainers.places)
    assert info.value.missing == [1]
    assert "ranks [1] never reached the rendezvous" in str(info.value)


def test_run_timeout_stops_ranks(mode, launcher, tmp_path):
    # The ranks must be running when the timeout fires (see timed_out_while_running): on a busy
    # machine mpirun can take longer than the first timeout to start them.
    def attempt(pid_dir: Path, timeout: float) -> None:
        with pytest.raises(RunTimeoutError, match=f"timeout={timeout:g}s"):
            HorovodRunner(
                np=ranks(mode, 2), launcher=launcher, timeout=timeout, grace_period=1
            ).run(hvd_trainers.block_forever, str(pid_dir))
        assert alive(recorded_pids(pid_dir)) == []

    timed_out_while_running(attempt, tmp_path, (6, 15, 40, 100))


@pytest.mark.parametrize("verbosity", ["log_callback_only", "all"])
def test_log_streaming(mode, launcher, verbosity, capsys):
    settings = {} if verbosity == "all" else {"driver_log_verbosity": verbosity}
    result = HorovodRunner(np=ranks(mode, 2), launcher=launcher, **settings).run(
        hvd_trainers.chatty, "t"
    )
    out = capsys.readouterr().out
    assert result == 0
    assert "[rank 0] callback from rank 0 t" in out and "[rank 1] callback from rank 1 t" in out
    if verbosity == "all":  # HorovodRunner's default, as Databricks' is now
        assert "[rank 0] stdout of rank 0 t" in out and "[rank 1] stdout of rank 1 t" in out
    else:
        assert "stdout of rank" not in out


# -- Part B: ranks on other hosts started through the tasks (mpirun's agent) ---------------


def test_mpi_daemons_start_through_the_tasks(mode, mpi):
    runner = HorovodRunner(np=ranks(mode, 2), launcher="mpi")
    runner._pre_rendezvous_hook = hvd_trainers.fake_hosts  # task i on "host" 127.0.0.(i+1)
    seen = runner.run(hvd_trainers.places)
    assert [p["rank"] for p in seen] == [p["env_rank"] for p in seen] == [0, 1]
    # Two hosts to MPI: rank 1 was started by Open MPI's daemon, which the agent had the
    # (other) task start; rank 0 by mpirun itself.
    assert [(p["local_rank"], p["local_size"], p["cross_rank"], p["cross_size"]) for p in seen] == [
        (0, 1, 0, 2),
        (0, 1, 1, 2),
    ]
    assert [p["parent"] for p in seen] == ["mpirun", "orted"]


def test_mpi_failure_on_an_agent_started_host(mode, mpi, tmp_path):
    runner = HorovodRunner(np=ranks(mode, 2), launcher="mpi", grace_period=2)
    runner._pre_rendezvous_hook = hvd_trainers.fake_hosts
    with pytest.raises(WorkerFailedError) as info:  # rank 0's allreduce would wait forever
        runner.run(hvd_trainers.fail_in_allreduce_loop, str(tmp_path), "raise")
    message = str(info.value)
    assert info.value.root_cause.rank == 1 and info.value.root_cause.host == "127.0.0.2"
    assert "raised RuntimeError: injected failure on rank 1" in message
    assert "Traceback" in message and "about to fail" in message
    pids = recorded_pids(Path(tmp_path))
    assert len(pids) == 2 and alive(pids) == []
