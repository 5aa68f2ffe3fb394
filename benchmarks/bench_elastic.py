"""How soon a run trains again after losing an executor, and how soon it is back at full size:
elastic (np=(1, 2)) against a fixed size (np=2) that waits for the cluster to replace the
executor, as every run did before; and TorchDistributor, which has no restart.

One Spark application on local-cluster[2,1,1024] (take the shared Spark lock). Every run
trains the same loop (tests/fixtures/row_counting.py): the DataFrame loader over ``--rows``
row ids, ``--step-time`` seconds of stand-in compute per step, a checkpoint with the loader's
place after every step, and a model that counts each row's training per epoch. After step 3
of attempt 0, rank 1 notes the time and SIGKILLs its executor's JVM (the worker starts a
replacement some seconds later, as a cluster replaces a lost node). The driver notes when the
replacement has registered ("capacity's return"); the ranks note when each step ended. For
each run it prints:

* loss → first step: from the kill to the end of the next attempt's first step;
* capacity → full size: from capacity's return to the end of the first step at 2 ranks after
  the loss (the fixed size's one restart; the elastic run's grow, at its first checkpoint
  once ``resize_interval=1`` has passed);
* rows twice / skipped: over the steps whose effect reached the final model, the rows trained
  more than once and those never trained, per epoch (both must be 0; the final model must
  hold exactly those counts); and the steps done again (those after the checkpoint the next
  attempt took up, whose effect was dropped).

Each run must go the right way before its time counts: one restart after rank 1's loss, for
the fixed size every attempt at 2 ranks, no rows trained twice or skipped; anything else stops
it with exit status 1. When pyspark.ml.torch.distributor imports, TorchDistributor (2
processes, local_mode=False) runs a function whose rank 1 kills its executor the same way; it
has no checkpoint or restart of its own, so its row says how it ended and when.

    flock /tmp/sparktrain-spark.lock python benchmarks/bench_elastic.py [--repeats 2] [--show-records]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from instruments import refuse, require

ROOT = Path(__file__).resolve().parents[1]
FIXED = "fixed np=2 (waits for the replacement)"
ELASTIC = "elastic np=(1, 2), resize_interval=1"
DISTRIBUTOR = "TorchDistributor(num_processes=2)"
EPOCHS = 1
KILL_AFTER = 3


class CapacityWatch:
    """Notes when the executors, having dropped below ``count``, are back to ``count``."""

    def __init__(self, spark: Any, count: int = 2) -> None:
        self._sc = spark.sparkContext._jsc.sc()
        self._count = count
        self._stop = threading.Event()
        self.dropped: float | None = None
        self.back: float | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _executors(self) -> int:
        return int(self._sc.getExecutorIds().size())

    def _watch(self) -> None:
        while not self._stop.wait(0.1):  # registration has no event Python can wait on
            seen = self._executors()
            if self.dropped is None and seen < self._count:
                self.dropped = time.time()
            elif self.dropped is not None and seen >= self._count:
                self.back = time.time()
                return

    def __enter__(self) -> CapacityWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def lose_executor_under_distributor(stamps: str) -> int:
    """TorchDistributor's function: rank 1 notes the time and kills its executor, rank 0
    waits to be ended; a rank started again (Spark retrying the stage) notes when instead."""
    import os
    import signal
    import time

    import psutil

    rank = int(os.environ["RANK"])
    try:  # each rank's first start leaves a mark; finding its own mark means a retry
        os.close(os.open(os.path.join(stamps, f"start.{rank}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        with open(os.path.join(stamps, f"again.{rank}"), "w") as fh:
            fh.write(repr(time.time()))
        return rank
    if rank == 1:
        jvm = next(
            p.pid
            for p in psutil.Process().parents()
            if any("CoarseGrainedExecutorBackend" in part for part in p.cmdline())
        )
        lost = os.path.join(stamps, "lost")
        with open(lost + ".part", "w") as fh:
            fh.write(repr(time.time()))
        os.rename(lost + ".part", lost)
        os.kill(jvm, signal.SIGKILL)
    time.sleep(300)  # rank 0 "trains" until the run ends it
    return rank


def one_run(
    spark: Any, runner: Any, converter: Any, args: argparse.Namespace, fixed: bool
) -> dict[str, Any]:
    """Train once, losing an executor; the times, sizes and row counts of the run."""
    from tests.fixtures import row_counting

    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as work:
        logs, ckpt = Path(work, "rows"), Path(work, "ckpt")
        logs.mkdir()
        with CapacityWatch(spark) as watch:
            result = runner.run(
                row_counting.train,
                converter,
                str(ckpt),
                str(logs),
                epochs=EPOCHS,
                batch_size=args.batch,
                kill_after=KILL_AFTER,
                kill="executor",
                step_time=args.step_time,
                keep_last=2,
            )
        record = runner.last_run
        if args.show_records:
            print(f"\n{record.describe()}", flush=True)
        sizes = record.sizes
        causes = [a.cause or "" for a in record.attempts[:1]]
        require("rank 1" in causes[0], f"the first restart's cause is not rank 1: {causes}")
        restarts = [a for a in record.attempts if a.error is not None and not a.resized]
        require(len(restarts) == 1, f"expected one restart: {record.describe()}")
        if fixed:
            require(sizes == [2, 2], f"a fixed run changed size: {sizes}")
        import fsspec

        steps = row_counting.read_steps(fsspec.filesystem("file"), str(logs))
        lost = float(Path(logs, row_counting.LOST).read_text())
        twice, skipped = row_counting.off_by_rows(steps, EPOCHS, args.rows)
        counts = steps.counts()
        model = [[float(counts[(e, i)]) for i in range(args.rows)] for e in range(EPOCHS)]
        require(result["seen"] == model, "the final model differs from the steps' row counts")
        # The first step at 2 ranks after the loss: the restart (fixed) or the grow (elastic).
        at_full = [steps.first_time(a) for a in range(1, steps.last + 1) if sizes[a] == 2]
        full = next((t for t in at_full if t is not None), None)
        first = steps.first_time(1)
        require(first is not None, "the restart never took a step")
        return {
            "loss": first - lost,
            "to_full": None if full is None or watch.back is None else full - watch.back,
            "sizes": "→".join(map(str, sizes)),
            "twice": twice,
            "skipped": skipped,
            "redone": len({(s.attempt, s.step) for s in steps.redone()}),
        }


def distributor_run(spark: Any) -> dict[str, Any]:
    """TorchDistributor losing rank 1's executor: how it ended, and when after the loss."""
    from pyspark.ml.torch.distributor import TorchDistributor

    with tempfile.TemporaryDirectory(prefix="bench-elastic-td-") as stamps:
        distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
        try:
            distributor.run(lose_executor_under_distributor, stamps)
        except Exception as exc:  # noqa: BLE001 - its failure is what is measured
            ended, outcome = time.time(), f"fails ({type(exc).__name__})"
        else:
            again = sorted(Path(stamps).glob("again.*"))
            require(bool(again), "TorchDistributor ended well without running the ranks again")
            # Spark ran the whole stage again, from the start (no resume): when it began.
            ended = min(float(p.read_text()) for p in again)
            outcome = "runs it all again"
        lost = float(Path(stamps, "lost").read_text())
        return {"loss": ended - lost, "outcome": outcome}


def wait_for_two(spark: Any, seconds: float = 180) -> None:
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + seconds
    while len(tracker.getExecutorInfos()) - 1 < 2:
        if time.monotonic() > deadline:
            refuse(f"the executors did not come back within {seconds:.0f} s")
        time.sleep(0.5)  # registration has no event Python can wait on


def has_distributor() -> bool:
    try:
        import pyspark.ml.torch.distributor  # noqa: F401
    except ImportError:
        return False
    return True


def cells(values: list[float | None]) -> tuple[str, str]:
    """The median and every value, as table cells ("—" where there is none)."""
    known = [v for v in values if v is not None]
    median = f"{statistics.median(known):.1f}" if known else "—"
    each = ", ".join("—" if v is None else f"{v:.1f}" for v in values)
    return median, each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4096, help="row ids in the one epoch")
    parser.add_argument("--batch", type=int, default=8, help="rows per rank per step")
    parser.add_argument("--step-time", type=float, default=0.05, help="compute per step, s")
    parser.add_argument(
        "--show-records",
        action="store_true",
        help="print each run's attempts and their phases (runner.last_run.describe())",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from pyspark.sql import SparkSession

    from sparktrain import SparkRunner
    from sparktrain.data import make_spark_converter
    from tests.conftest import spark_test_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local-cluster[2,1,1024]").appName("bench-elastic")
    for key, value in spark_test_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    common = {"max_restarts": 1, "grace_period": 2, "capacity_wait": 120, "progress": False}
    runners = {
        FIXED: (SparkRunner(np=2, **common), True),
        ELASTIC: (SparkRunner(np=(1, 2), resize_interval=1, **common), False),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    distributed: list[dict[str, Any]] = []
    cache = tempfile.mkdtemp(prefix="bench-elastic-cache-")
    try:
        wait_for_two(spark)
        df = spark.range(0, args.rows, 1, 4).selectExpr("id")
        converter = make_spark_converter(df, cache_dir=f"file://{cache}")
        for runner, _ in runners.values():  # warm both up once, uncounted
            runner.run(lambda: None)
        for _ in range(args.repeats):
            for name, (runner, fixed) in runners.items():
                wait_for_two(spark)
                runs[name].append(one_run(spark, runner, converter, args, fixed))
            if has_distributor():
                wait_for_two(spark)
                distributed.append(distributor_run(spark))
        wait_for_two(spark)
        converter.delete()
    finally:
        spark.stop()
        shutil.rmtree(cache, ignore_errors=True)
    print(
        f"\nan executor lost after step {KILL_AFTER} of one epoch of {args.rows} rows, batch "
        f"{args.batch} per rank, {args.step_time:g} s of compute per step; {args.repeats} runs "
        "each, seconds: median [each run]; ratio: loss → first step against the fixed size's"
    )
    rows = []
    base = statistics.median(r["loss"] for r in runs[FIXED])
    for name in runners:
        loss_median, loss_each = cells([r["loss"] for r in runs[name]])
        full_median, full_each = cells([r["to_full"] for r in runs[name]])
        rows.append(
            [
                name,
                f"{loss_median} [{loss_each}]",
                f"{full_median} [{full_each}]",
                ", ".join(r["sizes"] for r in runs[name]),
                ", ".join(f"{r['twice']} / {r['skipped']}" for r in runs[name]),
                ", ".join(str(r["redone"]) for r in runs[name]),
                f"{statistics.median(r['loss'] for r in runs[name]) / base:.2f}",
            ]
        )
    if distributed:
        loss_median, loss_each = cells([r["loss"] for r in distributed])
        outcome = ", ".join(sorted({r["outcome"] for r in distributed}))
        rows.append(
            [
                DISTRIBUTOR,
                f"{outcome} after {loss_median} [{loss_each}]",
                "— (never back)",
                "2",
                "— (no resume)",
                "—",
                "—",
            ]
        )
    head = [
        "run",
        "loss → first step",
        "capacity → first step at full size",
        "sizes",
        "rows twice / skipped",
        "steps redone",
        "ratio",
    ]
    widths = [max(len(row[c]) for row in [head, *rows]) for c in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
    if not distributed:
        print("(pyspark.ml.torch.distributor does not import here: no TorchDistributor row)")
    for name in runners:
        bad = [r for r in runs[name] if r["twice"] or r["skipped"]]
        require(not bad, f"{name}: rows trained twice or skipped: {bad}")


if __name__ == "__main__":
    main()
