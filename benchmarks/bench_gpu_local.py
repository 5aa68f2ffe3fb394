"""Launch cost of GPU runs on the driver (``np=-1``, NCCL) against the same function run in a
bare interpreter, as ``torchrun --nproc-per-node 1`` would start it.

The function is the GPU tests' DDP job on the rank's GPU (``tests/fixtures/gpu_trainers.py``):
``init_process_group`` with NCCL, a small linear model wrapped in DDP, five SGD steps, a
barrier. Each row is one call, timed around it: the
first sparktrain call starts its rank as a new interpreter (a zygote loads beside it), the
later ones fork it warm; each sparktrain row also gives rank 0's breakdown (load: from the
process's start to the function's call; function: the call itself, where CUDA and NCCL start).
The bare interpreter is started afresh each time (its time includes importing torch). A
no-op function shows the launch alone, on the GPU and with ``use_gpu=False``.

Every call's result is checked: the DDP losses fall and the rank ran on ``cuda:0``.

    python benchmarks/bench_gpu_local.py [--warm 5] [--bare 3]

Needs a CUDA GPU (and torch built with CUDA); no Spark.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from instruments import rank0_forked, require

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cloudpickle  # noqa: E402

from tests.fixtures import gpu_trainers  # noqa: E402 - the GPU tests' DDP function
from tests.fixtures.gpu_trainers import ddp_steps  # noqa: E402

cloudpickle.register_pickle_by_value(gpu_trainers)  # the ranks need not import tests/


def noop() -> int:
    return 1


BARE = """
import os, sys, json
sys.path.insert(0, {root!r})
from tests.fixtures.gpu_trainers import ddp_steps
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT={port!r}, RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
print("RESULT " + json.dumps(ddp_steps()))
"""


def _check(seen: dict[str, Any], what: str) -> None:
    require(seen["device"] == "cuda:0", f"{what} ran on {seen['device']}, not cuda:0")
    require(seen["losses"][-1] < seen["losses"][0], f"{what}: the loss did not fall")


def _bare(port: int) -> float:
    import json

    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", BARE.format(root=str(ROOT), port=str(port))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.perf_counter() - began
    require(proc.returncode == 0, f"the bare interpreter failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    _check(json.loads(line.removeprefix("RESULT ")), "the bare interpreter")
    return took


def _timed(runner: Any, fn: Any) -> tuple[float, Any, str]:
    began = time.perf_counter()
    seen = runner.run(fn)
    took = time.perf_counter() - began
    attempt = runner.last_run.attempts[-1]
    parts = ", ".join(
        f"{k} {attempt.breakdown[k]:.2f}" for k in ("load", "function") if k in attempt.breakdown
    )
    how = "forked" if rank0_forked(runner) else "new interpreter"
    return took, seen, f"{how}: {parts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=5, help="warm sparktrain calls")
    parser.add_argument("--bare", type=int, default=3, help="bare interpreter calls")
    args = parser.parse_args()
    import torch

    require(torch.cuda.is_available(), "needs a CUDA GPU")
    from sparktrain import SparkRunner

    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    rows: list[tuple[str, float, str]] = []
    gpu = SparkRunner(np=-1, use_gpu=True, progress=False)
    warm = []
    for i in range(args.warm + 1):
        took, seen, how = _timed(gpu, ddp_steps)
        _check(seen, "sparktrain's rank")
        rows.append(("sparktrain ddp " + ("first" if i == 0 else "warm"), took, how))
        if i:
            warm.append(took)
    noops = [_timed(gpu, noop) for _ in range(3)]
    rows += [("sparktrain no-op, GPU", t, how) for t, _, how in noops]
    cpu = SparkRunner(np=-1, use_gpu=False, progress=False)
    cpu_noops = [_timed(cpu, noop) for _ in range(4)][1:]  # the first loads its zygote
    rows += [("sparktrain no-op, use_gpu=False", t, how) for t, _, how in cpu_noops]
    bare = []
    for _ in range(args.bare):
        with socket.socket() as probe:  # a port for the bare run's store
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        bare.append(_bare(port))
        rows.append(("bare interpreter ddp", bare[-1], "new interpreter"))
    print("\n| call | seconds | rank 0 |\n|---|---|---|")
    for name, took, how in rows:
        print(f"| {name} | {took:.2f} | {how} |")
    first, bare_median = rows[0][1], statistics.median(bare)
    print(
        f"\nfirst call / bare interpreter: {first / bare_median:.2f}x; "
        f"warm median / bare interpreter: {statistics.median(warm) / bare_median:.2f}x "
        f"(warm median {statistics.median(warm):.2f} s, bare median {bare_median:.2f} s)"
    )


if __name__ == "__main__":
    main()
