"""How much of a warm Spark Connect run is Spark Connect's own: the bare stage beside the run.

A warm sparktrain call from a Connect session runs one barrier stage, the same shape as a bare
``range(0, 2, 1, 2).mapInArrow(f, schema, barrier=True)`` job whose two tasks return one row
each. This benchmark times that bare job (the floor: no sparktrain in it) and sparktrain's warm
no-op and gloo + all_reduce ``SparkRunner(np=2)`` calls, from a classic session and from a
Connect session, each on its own ``local-cluster[2,1,1024]`` (the classic side in one child process, the Connect server
and its client in another: a Connect client cannot follow a classic session in one process).

With ``--between torchdistributor``, an untimed TorchDistributor no-op runs on the same session
before each sparktrain call, as in ``bench_launch.py``, whose warm rows interleave the two
runners: the difference between the two tables is what the peer's call leaves behind.

It prints each cell's median, the Connect / classic ratio of each row, and what sparktrain adds
above the bare stage on each side, so that a target for the warm Connect call can be set
against what Spark Connect alone costs on the same machine. Every call's value is checked
before anything is printed.

With ``--cold N``, it times first calls instead, each on a Connect server of its own started
for it (new executors: no Python worker, no zygote): the bare stage, sparktrain's no-op and
gloo + all_reduce (the session's first stage, its checks included; the run's record must say
rank 0 was a new interpreter), and TorchDistributor's same two functions, each on a fresh server too (not after
sparktrain's call on the same one, as in ``bench_launch.py``, where it meets the Python
workers sparktrain started). N rounds, medians; it prints each first call against
TorchDistributor's, and the bare stage's share of the 0.3x target.

Usage::

    python benchmarks/bench_connect_floor.py [--repeats 10] [--between torchdistributor]
    python benchmarks/bench_connect_floor.py --cold 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bench_launch  # noqa: E402
import cloudpickle  # noqa: E402
import pyspark.cloudpickle as pyspark_cloudpickle  # noqa: E402
from bench_launch import allreduce, fresh_classic_session, fresh_connect_session, noop  # noqa: E402
from instruments import rank0_forked, require, require_cold  # noqa: E402

BARE = "bare barrier stage (2 tasks, Python, 1 row each)"
NOOP = "sparktrain warm no-op, np=2"
GLOO = "sparktrain warm gloo + all_reduce, np=2"

# The functions the runs call travel by value: bench_launch is not importable on the executors.
# TorchDistributor pickles with pyspark's own copy of cloudpickle, which keeps its own list.
cloudpickle.register_pickle_by_value(bench_launch)
pyspark_cloudpickle.register_pickle_by_value(bench_launch)


def _one_row(batches: Any) -> Any:
    import pyarrow as pa

    count = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"n": [count]})


def _bare_stage(spark: Any) -> Callable[[], None]:
    """The bare job: one barrier ``mapInArrow`` stage of two tasks, its rows fetched."""
    frame = spark.range(0, 2, 1, 2).mapInArrow(_one_row, "n long", barrier=True)

    def call() -> None:
        rows = frame.collect()
        require(sorted(row["n"] for row in rows) == [1, 1], f"bare stage returned {rows}")

    return call


def _sparktrain_calls(spark: Any) -> tuple[dict[str, Callable[[], None]], list[bool]]:
    """Warm sparktrain calls of both functions; the list collects whether each forked rank 0."""
    from sparktrain import SparkRunner

    runner = SparkRunner(np=2, spark=spark)
    forked: list[bool] = []

    def call(fn: Callable[[], Any], expected: float) -> Callable[[], None]:
        def run() -> None:
            value = runner.run(fn)
            require(value == expected, f"sparktrain's {fn.__name__} returned {value!r}")
            forked.append(bool(rank0_forked(runner)))

        return run

    return {NOOP: call(noop, 0), GLOO: call(allreduce, 3.0)}, forked


def _peer_call(spark: Any) -> Callable[[], None]:
    """TorchDistributor's no-op on the same session (run between, never timed)."""
    from pyspark.ml.torch.distributor import TorchDistributor

    peer = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)

    def call() -> None:
        require(peer.run(noop) in (0, 1), "TorchDistributor's no-op did not return a rank")

    return call


def _measure(spark: Any, repeats: int, between: str) -> dict[str, Any]:
    """Every call on ``spark``: two warm-up rounds, then ``repeats`` timed rounds, each round
    the bare stage and both sparktrain calls; with ``between="torchdistributor"``, an untimed
    TorchDistributor call before each sparktrain call."""
    ours, forked = _sparktrain_calls(spark)
    calls = {BARE: _bare_stage(spark), **ours}
    peer = _peer_call(spark) if between == "torchdistributor" else None
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(2 + repeats):
        if round_ == 2:
            forked.clear()
        for name, call in calls.items():
            if peer is not None and name != BARE:
                peer()
            start = time.perf_counter()
            call()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    return {"times": times, "forked": sum(forked), "calls": len(forked)}


def _side(kind: str, repeats: int, between: str) -> None:
    """One session's measurements, as JSON on stdout's last line."""
    if kind == "classic":
        with fresh_classic_session() as spark:
            result = _measure(spark, repeats, between)
    else:
        with fresh_connect_session("bench-connect-floor-") as spark:
            result = _measure(spark, repeats, between)
    print(json.dumps(result), flush=True)


def _child(kind: str, repeats: int, between: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--side", kind, "--repeats", str(repeats)]
    command += ["--between", between]
    # The bare stage's Python workers need this interpreter's pyarrow on the executors.
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    require(
        done.returncode == 0 and bool(done.stdout.strip()),
        f"the {kind} side failed (exit {done.returncode}):\n{done.stderr[-4000:]}",
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# The first calls --cold times, each on a fresh Connect server.
COLD = {
    "bare barrier stage": "bare",
    "sparktrain no-op": "sparktrain noop",
    "sparktrain gloo + all_reduce": "sparktrain allreduce",
    "TorchDistributor no-op": "torchdistributor noop",
    "TorchDistributor gloo + all_reduce": "torchdistributor allreduce",
}


def _first_run(cell: str, spark: Any) -> Callable[[], None]:
    """The call a ``--cold-call`` cell times on ``spark``: its runner's first run, value
    checked (and for sparktrain, checked to be cold), or the bare stage."""
    runner_name, _, fn_name = cell.partition(" ")
    if runner_name == "bare":
        return _bare_stage(spark)
    fn, expected = {"noop": (noop, (0, 1)), "allreduce": (allreduce, (3.0,))}[fn_name]
    if runner_name == "sparktrain":
        from sparktrain import SparkRunner

        runner: Any = SparkRunner(np=2, spark=spark)
    else:
        from pyspark.ml.torch.distributor import TorchDistributor

        runner = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)

    def call() -> None:
        value = runner.run(fn)
        require(value in expected, f"{cell} returned {value!r}")
        if runner_name == "sparktrain":
            require_cold(runner, cell)

    return call


def _cold_call(cell: str) -> None:
    """One first call on a fresh Connect server, its seconds as JSON on stdout's last line."""
    with fresh_connect_session("bench-connect-cold-") as spark:
        call = _first_run(cell, spark)
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds}), flush=True)


def _cold(rounds: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in COLD}
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    for _ in range(rounds):
        for name, cell in COLD.items():
            command = [sys.executable, __file__, "--cold-call", cell]
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            require(
                done.returncode == 0 and bool(done.stdout.strip()),
                f"{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}",
            )
            times[name].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"\nfirst call on a fresh Connect server, median of {rounds}, seconds")
    for name in COLD:
        print(f"{name:36} {med[name]:8.2f}   ({', '.join(f'{t:.2f}' for t in times[name])})")
    for fn in ("no-op", "gloo + all_reduce"):
        peer = med[f"TorchDistributor {fn}"]
        print(
            f"{fn:18} sparktrain / TorchDistributor {med[f'sparktrain {fn}'] / peer:5.2f}x; "
            f"0.3x is {0.3 * peer:.2f} s, the bare stage alone {med['bare barrier stage']:.2f} s "
            f"({med['bare barrier stage'] / peer:.2f}x)"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per cell")
    parser.add_argument(
        "--between",
        choices=("nothing", "torchdistributor"),
        default="nothing",
        help="run an untimed TorchDistributor no-op before each sparktrain call, as "
        "bench_launch.py's interleaving does (default: nothing)",
    )
    parser.add_argument(
        "--cold", type=int, metavar="N", help="time first calls instead, N rounds (see above)"
    )
    parser.add_argument("--side", choices=("classic", "connect"), help=argparse.SUPPRESS)
    parser.add_argument("--cold-call", choices=tuple(COLD.values()), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    require(args.repeats >= 1, "--repeats must be at least 1")
    if args.cold_call:
        _cold_call(args.cold_call)
        return
    if args.cold is not None:
        require(args.cold >= 1, "--cold must be at least 1")
        _cold(args.cold)
        return
    if args.side:
        _side(args.side, args.repeats, args.between)
        return
    sides = {kind: _child(kind, args.repeats, args.between) for kind in ("classic", "connect")}
    med = {
        kind: {name: statistics.median(values) for name, values in side["times"].items()}
        for kind, side in sides.items()
    }
    between = "" if args.between == "nothing" else ", a TorchDistributor call before each"
    print(f"\nmedians of {args.repeats} warm calls each{between}, seconds")
    print(f"{'':52} {'classic':>8} {'Connect':>8} {'Connect/classic':>16}")
    for name in (BARE, NOOP, GLOO):
        classic, connect = med["classic"][name], med["connect"][name]
        print(f"{name:52} {classic:8.3f} {connect:8.3f} {connect / classic:15.2f}x")
    above = {kind: med[kind][NOOP] - med[kind][BARE] for kind in med}
    print(f"{'no-op above the bare stage':52} {above['classic']:8.3f} {above['connect']:8.3f}")
    print(
        "\nrank 0 forked from a zygote: "
        + ", ".join(f"{kind} {side['forked']}/{side['calls']}" for kind, side in sides.items())
    )
    target = 1.5 * med["classic"][NOOP]
    print(
        f"a warm Connect no-op within 1.5x of classic must take <= {target:.3f} s; "
        f"the bare Connect stage alone takes {med['connect'][BARE]:.3f} s "
        f"({med['connect'][BARE] / target:.0%} of that)"
    )


if __name__ == "__main__":
    main()
