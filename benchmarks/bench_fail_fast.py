"""How soon a failed rank fails the run: Horovod over mpirun against Horovod over Gloo.

Rank 1 exits with code 1 right after ``hvd.init()`` (noting the time first) while rank 0
waits in an allreduce; the time from that exit to ``run()`` raising is measured for both
launchers in one process, with the default ``grace_period`` (10 s), and the median of each
is printed with its ratio to Gloo's. ``--spark`` runs the ranks on local-cluster[2,1,1024]
executors (take the shared Spark lock for that); by default they run on the driver (np=-2).

Each run must fail the right way before its time counts: rank 1 the root cause, exited with
code 1, rank 1's exit time written; anything else stops the benchmark with exit status 1.
The time is taken from rank 1's exit, so how the ranks started (cold or forked warm: mpirun
always starts new processes) does not enter it.

    python benchmarks/bench_fail_fast.py [--repeats 3] [--spark]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from instruments import refuse, require


def exit_after_init(stamp_dir: str) -> None:
    """Rank 1 notes the time and exits with code 1; rank 0 waits in an allreduce."""
    import os
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 1:
        with open(os.path.join(stamp_dir, "exit"), "w") as fh:
            fh.write(repr(time.time()))
        os._exit(1)
    hvd.allreduce(torch.ones(1), name="wait")


def one(np: int, launcher: str, spark: Any) -> float:
    """Seconds from rank 1's exit to run() raising."""
    from sparktrain import HorovodRunner, WorkerFailedError

    with tempfile.TemporaryDirectory(prefix="bench-fail-") as stamp_dir:
        runner = HorovodRunner(np=np, launcher=launcher, spark=spark)
        try:
            runner.run(exit_after_init, stamp_dir)
        except WorkerFailedError as exc:
            raised = time.time()
            require(
                exc.root_cause.rank == 1 and "exited with code 1" in str(exc),
                f"launcher={launcher}: the run failed otherwise than rank 1 exiting with code "
                f"1:\n{exc}",
            )
        else:
            refuse(f"launcher={launcher}: the run did not fail")
        stamp = os.path.join(stamp_dir, "exit")
        require(os.path.exists(stamp), f"launcher={launcher}: rank 1 never wrote its exit time")
        with open(stamp) as fh:
            return raised - float(fh.read())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per launcher")
    parser.add_argument("--spark", action="store_true", help="ranks on local-cluster executors")
    args = parser.parse_args(argv)
    spark = None
    np = -2
    if args.spark:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local-cluster[2,1,1024]")
            .appName("bench-fail-fast")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        np = 2
    medians = {}
    for launcher in ("gloo", "mpi"):
        times = [one(np, launcher, spark) for _ in range(args.repeats)]
        medians[launcher] = statistics.median(times)
        print(f"{launcher}: " + ", ".join(f"{t:.2f}s" for t in times), file=sys.stderr)
    where = "local-cluster executors (np=2)" if args.spark else "the driver (np=-2)"
    print(f"\nrank exit -> run() raises, on {where}, grace_period 10s, {args.repeats} runs each")
    print(f"{'launcher':<10}{'median':>10}{'vs gloo':>10}")
    for launcher, median in medians.items():
        print(f"{launcher:<10}{median:>9.2f}s{median / medians['gloo']:>9.2f}x")
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
