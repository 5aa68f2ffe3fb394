"""How soon a run trains again after losing an executor: elastic (np=(1, 2)) against a fixed
size (np=2) that waits for the cluster to replace the executor, as every run did before.

One Spark application on local-cluster[2,1,1024] (take the shared Spark lock). In each run,
rank 1 of the first attempt notes the time and SIGKILLs its executor's JVM (the worker starts a
replacement some seconds later, as a cluster replaces a lost node); rank 0 of the next attempt
notes the time of its first step. The time between the two is measured for both, alternating,
with ``max_restarts=1``, and printed with each run's sizes and the median's ratio to the fixed
size's. The elastic run does not grow back (``elastic_grow=False``): only the first step after
the loss counts. Between runs the benchmark waits until both executors are registered again.

Each run must go the right way before its time counts: one restart, rank 1's loss as its cause,
and for the fixed size both attempts at 2 ranks; anything else stops it with exit status 1. An
elastic run that found the replacement already there (restarted at 2) is shown and counted.

    flock /tmp/sparktrain-spark.lock python benchmarks/bench_elastic.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from instruments import refuse, require

ROOT = Path(__file__).resolve().parents[1]


def lose_executor_then_step(stamps: str) -> int:
    """Attempt 0: rank 1 notes the time and kills its executor; later: rank 0's first step."""
    import os
    import signal
    import time

    import psutil

    import sparktrain

    if sparktrain.attempt() == 0:
        if sparktrain.rank() == 1:
            jvm = next(
                p.pid
                for p in psutil.Process().parents()
                if any("CoarseGrainedExecutorBackend" in part for part in p.cmdline())
            )
            with open(os.path.join(stamps, "lost"), "w") as fh:
                fh.write(repr(time.time()))
            os.kill(jvm, signal.SIGKILL)
        while not sparktrain.should_stop():
            time.sleep(0.05)  # rank 0 "trains" until it is stopped for the restart
        return -1
    if sparktrain.rank() == 0:
        with open(os.path.join(stamps, "step"), "w") as fh:
            fh.write(repr(time.time()))
    return sparktrain.world_size()


def one_run(runner: Any, fixed: bool) -> tuple[float, list[int]]:
    """Seconds from the loss to the next attempt's first step, and the attempts' sizes."""
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as stamps:
        runner.run(lose_executor_then_step, stamps)
        record = runner.last_run
        require(len(record.attempts) == 2, f"expected one restart: {record.describe()}")
        cause = record.attempts[0].cause or ""
        require("rank 1" in cause, f"the restart's cause is not rank 1's loss: {cause}")
        if fixed:
            require(record.sizes == [2, 2], f"a fixed run changed size: {record.sizes}")
        lost = float(Path(stamps, "lost").read_text())
        step = float(Path(stamps, "step").read_text())
        return step - lost, record.sizes


def wait_for_two(spark: Any, seconds: float = 180) -> None:
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + seconds
    while len(tracker.getExecutorInfos()) - 1 < 2:
        if time.monotonic() > deadline:
            refuse(f"the executors did not come back within {seconds:.0f} s")
        time.sleep(0.5)  # registration has no event Python can wait on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from pyspark.sql import SparkSession

    from sparktrain import SparkRunner
    from tests.conftest import spark_test_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local-cluster[2,1,1024]").appName("bench-elastic")
    for key, value in spark_test_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    common = {"max_restarts": 1, "grace_period": 2, "capacity_wait": 120, "progress": False}
    runners = {
        "fixed np=2 (waits for the replacement)": (SparkRunner(np=2, **common), True),
        "elastic np=(1, 2)": (SparkRunner(np=(1, 2), elastic_grow=False, **common), False),
    }
    times: dict[str, list[float]] = {name: [] for name in runners}
    sizes: dict[str, list[str]] = {name: [] for name in runners}
    try:
        wait_for_two(spark)
        for runner, _ in runners.values():  # warm both up once, uncounted
            runner.run(lambda: None)
        for _ in range(args.repeats):
            for name, (runner, fixed) in runners.items():
                wait_for_two(spark)
                seconds, seen = one_run(runner, fixed)
                times[name].append(seconds)
                sizes[name].append("→".join(map(str, seen)))
    finally:
        spark.stop()
    base = statistics.median(times["fixed np=2 (waits for the replacement)"])
    print(f"\nfrom an executor's loss to the next attempt's first step ({args.repeats} runs each)")
    print(f"| {'run':<40} | {'median s':>8} | {'runs (s)':<20} | {'sizes':<12} | ratio |")
    print(f"|{'-' * 42}|{'-' * 10}|{'-' * 22}|{'-' * 14}|-------|")
    for name in runners:
        each = ", ".join(f"{t:.1f}" for t in times[name])
        median = statistics.median(times[name])
        print(
            f"| {name:<40} | {median:>8.1f} | {each:<20} | {', '.join(sizes[name]):<12} | "
            f"{median / base:.2f} |"
        )


if __name__ == "__main__":
    main()
