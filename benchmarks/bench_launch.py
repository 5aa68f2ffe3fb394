"""Launch overhead of SparkRunner against PySpark's TorchDistributor, measured in one session.

Runs two functions -- a no-op returning the rank, and "init gloo + one all_reduce" -- with 2
ranks on local-cluster[2,1,1024] executors (and on the driver), through both runners, and
prints the median wall time of each and the ratio. The first call of each runner is reported
separately as "cold" (it pays for Python workers and imports on fresh executors; under Spark
Connect, sparktrain's cold call also runs its one-task probe of the executors).

With ``--connect``, the same two functions also run from a Spark Connect client session on a
Connect server (a separate process, on its own local-cluster[2,1,1024]), through both runners
on that session: the "2 executors, Connect" rows, beside the classic session's rows.

It then prints, for sparktrain's warm runs, where the time went phase by phase (from each
run's own record, ``runner.last_run``), and the throughput of 2 ranks on the driver through
the runner against plain ``torch.multiprocessing`` processes: steps per second of a small
DDP model, and gloo all_reduce bandwidth on 16 and 64 MiB.

    python benchmarks/bench_launch.py [--repeats 5] [--skip-local] [--connect] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def noop() -> int:
    """Return this rank's RANK."""
    import os

    return int(os.environ.get("RANK", "-1"))


def allreduce() -> float:
    """Initialise gloo and sum rank + 1 over all ranks."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    return float(tensor.item())


def digits() -> bool:
    """The main job's training function, 3 epochs; whether it reached 90% accuracy."""
    from sparktrain.examples.digits import train

    return bool(train(epochs=3)["accuracy"] > 0.9)


def train_rate(steps: int = 200) -> float:
    """Steps per second of a small MLP under DDP (gloo), timed inside the rank."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(10):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    rate = steps / (time.perf_counter() - start)
    dist.destroy_process_group()
    return rate


def allreduce_rate(mib: int, repeats: int = 5) -> float:
    """GiB/s of gloo all_reduce on a ``mib`` MiB float32 tensor, timed inside the rank."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones((mib << 20) // 4)
    dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(tensor)
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    return repeats * mib / 1024 / seconds


def _plain_rank(
    index: int, world: int, port: int, fn: Callable[..., float], args: tuple, out: Any
) -> None:
    """One rank of the plain torch.multiprocessing job (the baseline for throughput)."""
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(index),
            "WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
        }
    )
    import torch

    torch.set_num_threads(1)
    value = fn(*args)
    if index == 0:
        out.put(value)


def plain(fn: Callable[..., float], *args: Any) -> float:
    """``fn(*args)`` on 2 ranks started by torch.multiprocessing; rank 0's value."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_plain_rank, args=(2, port, fn, args, out), nprocs=2, start_method="spawn")
    return float(out.get())


def _throughput_rows(repeats: int) -> list[tuple[str, float, float]]:
    """Step rate and all-reduce bandwidth of 2 ranks on the driver: runner and plain processes."""
    from sparktrain import SparkRunner

    runner = SparkRunner(np=-2)
    rows = []
    cases: list[tuple[str, Callable[..., float], tuple[Any, ...]]] = [
        ("DDP MLP, steps/s", train_rate, ()),
        ("all_reduce 16 MiB, GiB/s", allreduce_rate, (16,)),
        ("all_reduce 64 MiB, GiB/s", allreduce_rate, (64,)),
    ]
    for name, fn, args in cases:
        ours, theirs = [], []
        for _ in range(max(3, repeats // 2)):  # interleaved, so drift hits both alike
            ours.append(float(runner.run(fn, *args)))
            theirs.append(plain(fn, *args))
        rows.append((name, statistics.median(ours), statistics.median(theirs)))
    return rows


def _print_throughput(rows: list[tuple[str, float, float]]) -> None:
    if not rows:
        return
    print("\nthroughput with 2 ranks on the driver (medians; ratio = sparktrain / plain)")
    print(f"  {'what':<26} {'sparktrain':>10} {'plain torch.mp':>14} {'ratio':>6}")
    for name, ours, theirs in rows:
        print(f"  {name:<26} {ours:>10.2f} {theirs:>14.2f} {ours / theirs:>5.2f}x")


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def measure(
    call: Callable[[], Any],
    repeats: int,
    expect: Any,
    steps: list[dict[str, float]] | None = None,
    runner: Any = None,
) -> tuple[float, list[float]]:
    """The cold call's seconds and each warm call's; with ``runner``, each warm call's phases
    from its run record are appended to ``steps``."""
    cold, value = timed(call)
    assert value == expect, f"got {value!r}, expected {expect!r}"
    warm = []
    for _ in range(repeats):
        seconds, value = timed(call)
        assert value == expect, f"got {value!r}, expected {expect!r}"
        warm.append(seconds)
        if runner is not None and steps is not None:
            steps.append(run_steps(runner, seconds))
    return cold, warm


def run_steps(runner: Any, total: float) -> dict[str, float]:
    """Where one run's time went, from the runner's own record of it (``last_run``)."""
    attempt = runner.last_run.attempts[-1]
    spent = {"call → tasks ready": attempt.phases.get("capacity_wait", 0.0)}
    spent["call → tasks ready"] += attempt.phases.get("submit", 0.0)
    spent["rendezvous"] = attempt.phases.get("rendezvous", 0.0)
    labels = {
        "prepare": "backend prepare",
        "start": "rank process start",
        "load": "load function",
        "function": "the function",
        "result": "pickle result",
        "return": "result back",
    }
    for key, label in labels.items():
        if key in attempt.breakdown:
            spent[label] = float(attempt.breakdown[key])
    spent["teardown + rest"] = total - sum(spent.values())
    spent["forked warm (share)"] = float(bool(attempt.breakdown.get("forked")))
    return spent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm runs per cell")
    parser.add_argument("--skip-local", action="store_true", help="skip the driver-only rows")
    parser.add_argument(
        "--connect", action="store_true", help="add rows from a Spark Connect session"
    )
    parser.add_argument(
        "--skip-throughput",
        action="store_true",
        help="skip the step-rate and all-reduce bandwidth rows",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    from sparktrain import SparkRunner

    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("bench-launch")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # Let both executors register before anything is timed.
    SparkRunner(np=2).run(noop)

    rows: list[tuple[str, str, float, float, float, float]] = []
    breakdowns: list[tuple[str, list[dict[str, float]]]] = []
    cases: list[tuple[str, bool, Callable[..., Any], Any]] = [
        ("no-op", False, noop, 0),
        ("gloo + all_reduce", False, allreduce, 3.0),
        ("digits, 3 epochs", False, digits, True),
    ]
    if not args.skip_local:
        cases += [("no-op", True, noop, 0), ("gloo + all_reduce", True, allreduce, 3.0)]
    for name, local, fn, expect in cases:
        where = "driver, 2 ranks" if local else "2 executors"
        ours = SparkRunner(np=-2 if local else 2)
        peer = TorchDistributor(num_processes=2, local_mode=local, use_gpu=False)
        # TorchDistributor returns the output of whichever local rank wrote last (see notes).
        peer_expect = None if (local and fn is noop) else expect

        def run_ours(ours: SparkRunner = ours, fn: Callable[..., Any] = fn) -> Any:
            return ours.run(fn)

        def run_peer(peer: TorchDistributor = peer, fn: Callable[..., Any] = fn) -> Any:
            return peer.run(fn)

        steps: list[dict[str, float]] = []
        ours_cold, ours_warm = measure(run_ours, args.repeats, expect, steps, ours)
        breakdowns.append((f"{name}, {where}", steps))
        if peer_expect is None:
            peer_cold, peer_warm = _unchecked(run_peer, args.repeats)
        else:
            peer_cold, peer_warm = measure(run_peer, args.repeats, peer_expect)
        rows.append(
            (
                name,
                where,
                ours_cold,
                statistics.median(ours_warm),
                peer_cold,
                statistics.median(peer_warm),
            )
        )
    throughput = [] if args.skip_throughput else _throughput_rows(args.repeats)
    spark.stop()
    if args.connect:
        rows += _connect_rows(args.repeats)

    header = (
        f"{'function':<18} {'where':<22} {'sparktrain cold':>15} {'sparktrain warm':>15} "
        f"{'TorchDistributor cold':>21} {'TorchDistributor warm':>21} {'warm ratio':>10} "
        f"{'ours / TD':>9}"
    )
    print()
    print(
        f"launch time, seconds (median of {args.repeats} warm runs; ratio = "
        "TorchDistributor / sparktrain, higher is better for sparktrain)"
    )
    print(header)
    print("-" * len(header))
    for name, where, oc, ow, pc, pw in rows:
        print(
            f"{name:<18} {where:<22} {oc:>15.2f} {ow:>15.2f} {pc:>21.2f} {pw:>21.2f} "
            f"{pw / ow:>9.1f}x {ow / pw:>8.2f}x"
        )
    _print_breakdowns(breakdowns)
    _print_throughput(throughput)
    print(f"\nload average (1, 5, 15 min) at the end: {os.getloadavg()}")


def _print_breakdowns(breakdowns: list[tuple[str, list[dict[str, float]]]]) -> None:
    """sparktrain's warm runs, phase by phase (medians), from each run's own record."""
    for title, steps in breakdowns:
        if not steps:
            continue
        print(f"\nsparktrain, {title}: where a warm run's time went (median seconds)")
        for key in steps[0]:
            value = statistics.median(s.get(key, 0.0) for s in steps)
            print(f"  {key:<22} {value:>7.3f}")


def _connect_rows(repeats: int) -> list[tuple[str, str, float, float, float, float]]:
    """The two functions from a Spark Connect session, through both runners."""
    import tempfile
    from pathlib import Path

    from pyspark.ml.torch.distributor import TorchDistributor

    from sparktrain import SparkRunner

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from tests.connect.server import connect_server, connect_session

    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    log = Path(tempfile.mkdtemp(prefix="bench-connect-")) / "server.log"
    rows = []
    with connect_server("local-cluster[2,1,1024]", conf, log, [str(root)]) as url:
        with connect_session(url) as spark:
            spark.range(2).collect()  # the executors register and start Python
            for name, fn, expect in [("no-op", noop, 0), ("gloo + all_reduce", allreduce, 3.0)]:
                ours = SparkRunner(np=2, spark=spark)
                peer = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)

                def run_ours(ours: SparkRunner = ours, fn: Callable[..., Any] = fn) -> Any:
                    return ours.run(fn)

                def run_peer(peer: TorchDistributor = peer, fn: Callable[..., Any] = fn) -> Any:
                    return peer.run(fn)

                ours_cold, ours_warm = measure(run_ours, repeats, expect)
                peer_cold, peer_warm = measure(run_peer, repeats, expect)
                rows.append(
                    (
                        name,
                        "2 executors, Connect",
                        ours_cold,
                        statistics.median(ours_warm),
                        peer_cold,
                        statistics.median(peer_warm),
                    )
                )
    return rows


def _unchecked(call: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    cold, _ = timed(call)
    return cold, [timed(call)[0] for _ in range(repeats)]


if __name__ == "__main__":
    main()
