"""Launch overhead of SparkRunner against PySpark's TorchDistributor, measured in one session.

Runs two functions -- a no-op returning the rank, and "init gloo + one all_reduce" -- with 2
ranks on local-cluster[2,1,1024] executors (and on the driver), through both runners, and
prints the median wall time of each and the ratio. The first call of each runner is reported
separately as "cold" (it pays for Python workers and imports on fresh executors; under Spark
Connect, sparktrain's cold call also runs its one-task probe of the executors).

With ``--connect``, the same two functions also run from a Spark Connect client session on a
Connect server (a separate process, on its own local-cluster[2,1,1024]), through both runners
on that session: the "2 executors, Connect" rows, beside the classic session's rows.

    python benchmarks/bench_launch.py [--repeats 5] [--skip-local] [--connect]
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


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def measure(call: Callable[[], Any], repeats: int, expect: Any) -> tuple[float, list[float]]:
    cold, value = timed(call)
    assert value == expect, f"got {value!r}, expected {expect!r}"
    warm = []
    for _ in range(repeats):
        seconds, value = timed(call)
        assert value == expect, f"got {value!r}, expected {expect!r}"
        warm.append(seconds)
    return cold, warm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm runs per cell")
    parser.add_argument("--skip-local", action="store_true", help="skip the driver-only rows")
    parser.add_argument(
        "--connect", action="store_true", help="add rows from a Spark Connect session"
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
    cases: list[tuple[str, bool, Callable[..., Any], Any]] = [
        ("no-op", False, noop, 0),
        ("gloo + all_reduce", False, allreduce, 3.0),
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

        ours_cold, ours_warm = measure(run_ours, args.repeats, expect)
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
    spark.stop()
    if args.connect:
        rows += _connect_rows(args.repeats)

    header = (
        f"{'function':<18} {'where':<22} {'sparktrain cold':>15} {'sparktrain warm':>15} "
        f"{'TorchDistributor cold':>21} {'TorchDistributor warm':>21} {'warm ratio':>10}"
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
            f"{pw / ow:>9.1f}x"
        )


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
