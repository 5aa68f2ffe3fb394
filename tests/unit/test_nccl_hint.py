"""A rank that asks for NCCL where it cannot have it (a CPU torch, no GPU) fails with advice
that names sparktrain.default_backend() and gloo."""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner
from sparktrain.errors import NCCL_WITHOUT_GPU_HINT, WorkerFailedError, WorkerFailure

CPU_TORCH = """Traceback (most recent call last):
  File "train.py", line 4, in train
    dist.init_process_group("nccl")
RuntimeError: Distributed package doesn't have NCCL built in
"""


def _failure(rank: int, time: float, **kwargs: object) -> WorkerFailure:
    return WorkerFailure(rank=rank, time=time, host=f"host{rank}", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc_type", "message"),
    [
        ("RuntimeError", "Distributed package doesn't have NCCL built in"),
        ("ValueError", "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"),
        (
            "DistBackendError",
            "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version "
            "2.21.5\nLast error:\nCuda failure 'no CUDA-capable device is detected'",
        ),
    ],
)
def test_nccl_without_a_gpu_gets_the_hint_under_the_headline(exc_type, message) -> None:
    failure = _failure(0, 1.0, exc_type=exc_type, message=message, user_error=True)
    lines = failure.describe().splitlines()
    assert lines[0].startswith(f"rank 0 on host0 raised {exc_type}: ")
    assert lines[len(message.splitlines())] == NCCL_WITHOUT_GPU_HINT  # under the headline
    assert "sparktrain.default_backend()" in NCCL_WITHOUT_GPU_HINT
    assert '"gloo" on CPUs' in NCCL_WITHOUT_GPU_HINT


def test_the_hint_closes_a_report_of_several_ranks() -> None:
    nccl = dict(exc_type="RuntimeError", traceback=CPU_TORCH, user_error=True)
    error = WorkerFailedError(
        {
            0: _failure(0, 1.0, message="Distributed package doesn't have NCCL built in", **nccl),
            1: _failure(1, 2.0, message="Distributed package doesn't have NCCL built in", **nccl),
        }
    )
    lines = str(error).splitlines()
    assert lines[-3:] == [
        "Root cause, as above: rank 0 on host0 raised RuntimeError: Distributed package "
        "doesn't have NCCL built in",
        "RuntimeError: Distributed package doesn't have NCCL built in",
        NCCL_WITHOUT_GPU_HINT,
    ]


def test_other_errors_get_no_hint() -> None:
    gloo = _failure(0, 1.0, exc_type="RuntimeError", message="Gloo connectFullMesh failed")
    assert gloo.hint == ""
    assert "hint:" not in gloo.describe()
    killed = _failure(0, 1.0, exit_code=-9, output_tail=("NCCL INFO Bootstrap",))
    assert killed.hint == ""


def _ddp_for_gpus() -> None:
    import torch.distributed as dist

    dist.init_process_group("nccl")


def test_a_local_run_that_asks_for_nccl_on_this_cpu_names_the_fix() -> None:
    import torch.distributed as dist

    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL: init_process_group('nccl') fails otherwise here")
    with pytest.raises(WorkerFailedError) as failed:
        SparkRunner(np=-1, progress=False).run(_ddp_for_gpus)
    text = str(failed.value)
    assert "raised RuntimeError: Distributed package doesn't have NCCL built in" in text
    assert NCCL_WITHOUT_GPU_HINT in text
