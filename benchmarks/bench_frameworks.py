"""The frameworks people train with, through SparkRunner and through TorchDistributor, on one
session: what each framework saw, and the warm wall time of each call.

For each framework and layout -- Lightning's host form ``Trainer(devices=2, num_nodes=1)``
and TorchDistributor's form ``Trainer(devices=1, num_nodes=2)``, Hugging Face's ``Trainer``
(a one-layer GPT-2 from a config), an ``accelerate.Accelerator(cpu=True)`` loop, FSDP on gloo
-- the same function (tests/fixtures/framework_trainers.py) runs with 2 ranks on the two
executors of ``local-cluster[2,1,1024]`` through ``SparkRunner(np=2)`` and through PySpark's
``TorchDistributor(num_processes=2, local_mode=False)``. Every call's value is checked before
anything is printed: the framework saw a world of 2, ranks 0 and 1, and both ranks ended with
the same parameters; a call that returns something else stops the benchmark (exit status 1).
A call that fails is shown as failing, with its error, and gets no time; one that has not
ended after ``--deadline`` seconds is shown as hung (its Spark job is cancelled).

The first call of each pair is a cold start and is not timed; the table shows the median of
the warm calls and their ratio (TorchDistributor's time over sparktrain's).

    PYTHONPATH=. python benchmarks/bench_frameworks.py [--repeats 2] [--deadline 120]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cloudpickle  # noqa: E402
from instruments import require  # noqa: E402

from tests.fixtures import framework_trainers as ft  # noqa: E402

cloudpickle.register_pickle_by_value(ft)  # executors do not have the tests package

# What each framework calls world size, rank, local rank (and node, device) in its view.
VIEW_KEYS = {
    "lightning": ("world_size", "global_rank", "local_rank", "node_rank", "device", "environment"),
    "hf": ("world_size", "process_index", "local_process_index", "device"),
    "accelerate": ("num_processes", "process_index", "local_process_index", "device"),
    "fsdp": ("world_size", "rank", "local_rank", "shard_numel"),
}


@dataclasses.dataclass
class Case:
    """One framework in one layout: the function, its arguments, the framework's name."""

    name: str
    framework: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    ours: dict[str, Any] = dataclasses.field(default_factory=dict)  # extra SparkRunner settings


@dataclasses.dataclass
class Result:
    """One runner on one case: the warm seconds, or the error; what the framework saw."""

    warm: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None
    seen: str = ""

    def cell(self) -> str:
        return f"fails: {self.error}" if self.error else f"{statistics.median(self.warm):.2f}"


def cases(root: str, node_setting: bool) -> list[Case]:
    task_form = {"node": "task"} if node_setting else {}
    return [
        Case("Lightning devices=2 num_nodes=1", "lightning", ft.lightning_fit, (root, 2, 1)),
        Case(
            "Lightning devices=1 num_nodes=2",
            "lightning",
            ft.lightning_fit,
            (root, 1, 2),
            task_form,
        ),
        Case("HF Trainer (GPT-2, 1 layer)", "hf", ft.hf_train, (root,)),
        Case("accelerate cpu=True", "accelerate", ft.accelerate_loop, ()),
        Case("FSDP (gloo)", "fsdp", ft.fsdp_train, ()),
    ]


def check(case: Case, who: str, value: Any) -> str:
    """Refuse unless 2 ranks saw a world of 2 and ended with equal parameters; say what
    the framework saw."""
    views = value["ranks"] if isinstance(value, dict) else None
    require(
        isinstance(views, list) and len(views) == 2,
        f"{who}, {case.name}: returned {value!r:.300}, not both ranks' views",
    )
    keys = VIEW_KEYS[case.framework]
    require(
        [v[keys[0]] for v in views] == [2, 2] and [v[keys[1]] for v in views] == [0, 1],
        f"{who}, {case.name}: the framework saw {views}, not a world of 2 with ranks 0 and 1",
    )
    sums = [v["checksum"] for v in views]
    require(
        abs(sums[0] - sums[1]) <= 1e-6 * max(1.0, abs(sums[0])),
        f"{who}, {case.name}: the ranks ended with different parameters ({sums})",
    )
    return "; ".join(f"{k} {tuple(v[k] for v in views)}" for k in keys[2:])


# Peer calls that failed on a port taken between TorchDistributor's choice and its bind.
RETRIED: list[str] = []


class Hung(Exception):
    """A call that had not ended by the deadline (its Spark jobs were cancelled)."""


def call_with_deadline(spark: Any, runner: Any, case: Case, deadline: float) -> Any:
    """``runner.run(case.fn, *case.args)``; past ``deadline`` seconds, cancel the session's
    jobs and raise :class:`Hung` (TorchDistributor can wait forever for a rank that aborted
    after it finished: torchrun's agent in its exit barrier)."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = runner.run(case.fn, *case.args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome["error"] = error

    thread = threading.Thread(target=call, name="bench-call", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        spark.sparkContext.cancelAllJobs()
        thread.join(60)
        raise Hung(f"no end after {deadline:.0f} s (its Spark job was cancelled)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def measure(spark: Any, case: Case, who: str, runner: Any, repeats: int, deadline: float) -> Result:
    """A cold call of ``runner.run`` (not timed), then ``repeats`` warm ones, each checked."""
    result = Result()
    for i in range(repeats + 1):
        began = time.perf_counter()
        try:
            try:
                value = call_with_deadline(spark, runner, case, deadline)
            except Exception as error:
                # TorchDistributor picks a free port, then binds it later: another process
                # can take it first. That call measured nothing: said, and retried once.
                if who == "sparktrain" or "EADDRINUSE" not in str(error):
                    raise
                RETRIED.append(f"{who}, {case.name}")
                began = time.perf_counter()
                value = call_with_deadline(spark, runner, case, deadline)
        except Exception as error:  # noqa: BLE001 - a failing layout is a result
            first = str(error).strip().splitlines()
            lines = [line for line in first if "Error" in line] or first or [""]
            result.error = (
                f"call {i + 1} of {repeats + 1}: {type(error).__name__}: {lines[0][:160]}"
            )
            return result
        seconds = time.perf_counter() - began
        result.seen = check(case, who, value)
        if i:
            result.warm.append(seconds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="warm calls per cell (default 2)")
    parser.add_argument(
        "--deadline", type=float, default=120.0, help="seconds before a call counts as hung"
    )
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    from sparktrain import SparkRunner
    from sparktrain.config import RunConfig

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("bench-frameworks")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    node_setting = "node" in {f.name for f in dataclasses.fields(RunConfig)}
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as root:
            for case in cases(root, node_setting):
                ours_runner = SparkRunner(
                    np=2, spark=spark, driver_log_verbosity="log_callback_only", **case.ours
                )
                peer = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
                ours = measure(spark, case, "sparktrain", ours_runner, args.repeats, args.deadline)
                theirs = measure(spark, case, "TorchDistributor", peer, args.repeats, args.deadline)
                rows.append((case, ours, theirs))
                print(f"done: {case.name}", file=sys.stderr, flush=True)
    finally:
        spark.stop()

    print(
        f"\nWarm wall time per call (median of {args.repeats}), 2 ranks on the 2 executors of "
        "local-cluster[2,1,1024]; sparktrain: SparkRunner(np=2"
        f"{', node=task for the num_nodes=2 form' if node_setting else ''}); "
        "TorchDistributor(num_processes=2, local_mode=False)\n"
    )
    print("| framework, layout | runner | seconds | TD/ST | what the framework saw (rank 0, 1) |")
    print("|---|---|---|---|---|")
    for case, ours, theirs in rows:
        ratio = (
            f"{statistics.median(theirs.warm) / statistics.median(ours.warm):.1f}x"
            if ours.warm and theirs.warm and not (ours.error or theirs.error)
            else "-"
        )
        print(f"| {case.name} | sparktrain | {ours.cell()} | {ratio} | {ours.seen or '-'} |")
        print(f"| | TorchDistributor | {theirs.cell()} | | {theirs.seen or '-'} |")
    if RETRIED:
        print(f"\nretried once after EADDRINUSE: {', '.join(RETRIED)}")
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
