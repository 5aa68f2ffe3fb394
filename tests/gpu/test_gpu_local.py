"""On a CUDA machine, through the local mode (np < 0): ranks on the GPU, NCCL, the built-in
horovod.torch on CUDA tensors. Skipped where there is no GPU."""

from __future__ import annotations

import math

import pytest

from sparktrain import SparkRunner
from tests.fixtures import gpu_trainers


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpus() == 0, reason="needs a CUDA GPU")]


def test_ddp_runs_on_the_gpu_over_nccl() -> None:
    seen = SparkRunner(np=-1, use_gpu=True).run(gpu_trainers.ddp_steps)
    assert seen["backend"] == "nccl"
    assert seen["device"] == "cuda:0" and seen["param_device"] == "cuda:0"
    assert all(math.isfinite(v) for v in seen["losses"])
    assert seen["losses"][-1] < seen["losses"][0]


@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs")
def test_ddp_two_ranks_two_gpus() -> None:
    seen = SparkRunner(np=-2, use_gpu=True).run(gpu_trainers.ddp_steps)
    assert seen["backend"] == "nccl" and seen["losses"][-1] < seen["losses"][0]


def test_builtin_horovod_reduces_cuda_tensors() -> None:
    seen = SparkRunner(np=-1, backend="horovod", horovod_impl="builtin", use_gpu=True).run(
        gpu_trainers.builtin_horovod_on_gpu
    )
    assert "sparktrain" in seen["module_file"], seen["module_file"]
    assert seen["size"] == 1
    assert seen["summed"] == [1.0, 1.0, 1.0] and seen["summed_device"] == "cuda:0"
    assert seen["gathered"] == [0.0, 0.0]
    assert seen["losses"][-1] < seen["losses"][0]


def test_a_rank_forked_warm_uses_its_gpu_over_nccl() -> None:
    # The zygote loads beside the first runs; once it has, ranks are forked from it and must
    # still initialise CUDA and NCCL themselves, on the GPU they were given.
    runner = SparkRunner(np=-1, use_gpu=True)
    for _ in range(30):  # each run is a real one; the zygote loads meanwhile
        seen = runner.run(gpu_trainers.ddp_steps)
        if runner.last_run.attempts[-1].breakdown.get("forked"):
            break
    assert runner.last_run.attempts[-1].breakdown.get("forked"), "no run was forked warm"
    assert seen["backend"] == "nccl"
    assert seen["device"] == "cuda:0" and seen["param_device"] == "cuda:0"
    assert seen["losses"][-1] < seen["losses"][0]
