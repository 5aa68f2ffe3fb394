"""The NCCL flight recorder on a rank with GPUs: the rank's environment keeps it, and a stack
request also writes its trace to a file that the rank's output names. No GPU here: torch's
dump function is replaced by one that returns known bytes, and the default group is said to
be NCCL's; where it is not, nothing is written."""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparktrain import contract
from sparktrain.backends.horovod import HorovodBackend
from sparktrain.backends.torch import TorchBackend
from sparktrain.config import RunConfig
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.task.process import RankProcess, stop_all
from sparktrain.task.rank_launchers import worker_env
from sparktrain.worker import nccl_trace
from tests.unit.test_rank_env import gpu_spec

TRACE = b"\x80\x04pickled nccl trace"


def _env(tmp_path: Path, gpus: tuple[str, ...], **settings: object) -> dict[str, str]:
    config = RunConfig(np=-1, **settings)  # type: ignore[arg-type]
    job = TaskJob(run_id="r", attempt=0, config=config.to_json(), channel="", key=b"", payload=b"")
    spec = gpu_spec([("h", gpus)])
    return worker_env(TaskSession(job, None), spec, spec.ranks[0], TorchBackend(), {}, tmp_path)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("clean_env")
def test_a_rank_with_gpus_keeps_the_flight_recorder_and_writes_its_trace(tmp_path: Path) -> None:
    env = _env(tmp_path, ("0",))
    # torch 2.13 here: the name it reads without a deprecation warning on every rank.
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    assert env[contract.NCCL_TRACE_ENV] == "1"
    assert contract.NCCL_TRACE_DIR_ENV not in env  # no log_dir: the private folder
    logs = _env(tmp_path, ("0",), log_dir=str(tmp_path / "logs"))
    assert logs[contract.NCCL_TRACE_DIR_ENV] == str(tmp_path / "logs" / "r" / "attempt-1")


@pytest.mark.usefixtures("clean_env")
def test_a_rank_without_gpus_is_left_as_it_was(tmp_path: Path) -> None:
    env = _env(tmp_path, ())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & set(env)
    assert contract.NCCL_TRACE_ENV not in env


@pytest.mark.usefixtures("clean_env")
def test_a_buffer_size_of_the_users_is_left_alone(tmp_path: Path) -> None:
    env = _env(tmp_path, ("0",), env={"TORCH_FR_BUFFER_SIZE": "0"})
    assert env["TORCH_FR_BUFFER_SIZE"] == "0" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    horovod = HorovodBackend().env_defaults(
        {contract.HOROVOD_SHIM_ENV: "builtin", "CUDA_VISIBLE_DEVICES": "1"}
    )
    assert horovod["TORCH_FR_BUFFER_SIZE"] == "2000"  # sparktrain's Horovod on torch


def test_the_flight_recorder_s_variable_is_the_one_the_torch_version_reads() -> None:
    from sparktrain.backends.torch import flight_recorder_names

    assert flight_recorder_names("2.13.0+cpu")[0] == "TORCH_FR_BUFFER_SIZE"
    assert flight_recorder_names("2.8.1")[0] == "TORCH_FR_BUFFER_SIZE"
    assert flight_recorder_names("2.7.1+cu126")[0] == "TORCH_NCCL_TRACE_BUFFER_SIZE"
    assert flight_recorder_names("not a version")[0] == "TORCH_FR_BUFFER_SIZE"


@pytest.fixture
def nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's NCCL dump function, where this CPU build has none, and an NCCL default group."""
    c10d = SimpleNamespace(_dump_nccl_trace=lambda: TRACE)
    monkeypatch.setitem(
        sys.modules, "torch", SimpleNamespace(_C=SimpleNamespace(_distributed_c10d=c10d))
    )
    monkeypatch.setattr(nccl_trace, "_nccl_group", lambda: True)


@pytest.mark.usefixtures("nccl")
def test_the_trace_goes_beside_the_ranks_log_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "logs" / "run" / "attempt-1"
    environ = {"RANK": "3", contract.NCCL_TRACE_DIR_ENV: str(folder)}
    path = nccl_trace.answer(environ)
    assert path == folder / "rank-3.nccl-trace.pkl"
    assert path.read_bytes() == TRACE
    assert path.stat().st_mode & 0o777 == 0o600
    line = capsys.readouterr().err.strip()
    assert line.startswith(contract.NCCL_TRACE_NOTE) and f"is in {path} " in line


@pytest.mark.usefixtures("nccl")
def test_without_log_dir_the_trace_goes_to_the_private_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    environ = {"RANK": "1", contract.RUN_ID_ENV: "abc", contract.ATTEMPT_ENV: "1"}
    path = nccl_trace.answer(environ)
    assert path == tmp_path / f"sparktrain-{os.getuid()}" / "nccl-traces" / (
        "abc-attempt2-rank1.nccl-trace.pkl"
    )
    assert path.read_bytes() == TRACE


def test_where_the_group_is_not_nccls_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "logs"
    assert nccl_trace.answer({"RANK": "0", contract.NCCL_TRACE_DIR_ENV: str(folder)}) is None
    assert not folder.exists()
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"{contract.NCCL_TRACE_NOTE} is not written: the rank's process group")


@pytest.mark.usefixtures("nccl")
def test_a_trace_that_cannot_be_written_is_said_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    environ = {"RANK": "0", contract.NCCL_TRACE_DIR_ENV: str(tmp_path / "file" / "logs")}
    assert nccl_trace.answer(environ) is None
    assert "is not written: it could not be written: NotADirectoryError" in capsys.readouterr().err


# A rank blocked in C on its main thread (as in .item() behind a hung NCCL collective), with
# torch's dump function replaced and its default group said to be NCCL's.
BLOCKED = """
    import sys, threading, types
    from sparktrain.worker import bootstrap, nccl_trace

    c10d = types.SimpleNamespace(_dump_nccl_trace=lambda: b"the trace")
    sys.modules["torch"] = types.SimpleNamespace(_C=types.SimpleNamespace(_distributed_c10d=c10d))
    nccl_trace._nccl_group = lambda: True

    def blocked():
        print("ready", flush=True)
        threading.Event().wait()

    bootstrap._answer_stack_requests()
    blocked()
"""


def test_a_blocked_rank_asked_for_its_stack_writes_its_trace_before_it_is_stopped(
    started: list[RankProcess], tmp_path: Path
) -> None:
    ready = threading.Event()
    folder = tmp_path / "logs"
    env = {
        **os.environ,
        "RANK": "0",
        contract.NCCL_TRACE_ENV: "1",
        contract.NCCL_TRACE_DIR_ENV: str(folder),
    }
    proc = RankProcess(
        0,
        [sys.executable, "-c", textwrap.dedent(BLOCKED)],
        env,
        str(tmp_path),
        on_line=lambda rank, line: ready.set() if line == "ready" else None,
        on_exit=lambda rank, code: None,
        dumps_stacks=True,
    )
    started.append(proc)
    assert ready.wait(30), "the process never got ready"
    stop_all([proc], grace=1.0, stack_wait=30.0)
    assert proc.join(10)
    assert proc.last_stack is not None
    assert "blocked" in [frame.name for frame in proc.last_stack.frames]  # its stack came too
    trace = folder / "rank-0.nccl-trace.pkl"
    assert trace.read_bytes() == b"the trace"
    assert any(
        line.startswith(contract.NCCL_TRACE_NOTE) and str(trace) in line for line in proc.tail
    )
