"""Launch overhead of SparkRunner against PySpark's TorchDistributor, measured in one run.

Runs three functions -- a no-op returning the rank, "init gloo + one all_reduce", and the
digits job -- with 2 ranks on local-cluster[2,1,1024] executors (and the first two on the
driver), through both runners, and prints the cold call, the median of the warm calls, and
the ratio. Every call's value is checked (each function returns what only a finished run can);
a wrong value stops the benchmark with exit status 1 before any ratio is printed.

States (see benchmarks/instruments.py):

* **cold**: each function gets a fresh SparkSession (new executor JVMs, their Python workers
  not started, no zygote); only a plain Spark job without Python runs first, so both executors
  have registered. sparktrain's call goes first, then TorchDistributor's (which so meets the
  Python workers sparktrain started: any head start is the peer's). On the driver, cold is
  the first call in a fresh Python process (a child of this one, timed inside it). Each cold
  call's own record (``runner.last_run``) must say rank 0 was a new interpreter, not forked
  from a zygote; if it was forked, the benchmark refuses to go on. Under Spark Connect,
  sparktrain's cold call is the session's first stage, whose tasks also check the executors'
  versions and that they reach the client.
* **warm**: the same session's later calls; the table says in how many rank 0 was forked.

With ``--connect``, the first two functions also run from a Spark Connect client session on a
Connect server (a separate process, on its own local-cluster[2,1,1024], fresh per function),
through both runners on that session: the "2 executors, Connect" rows.

It then prints, for sparktrain's warm runs, where the time went phase by phase (from each
run's own record), and the throughput of 2 ranks on the driver through the runner against
plain ``torch.multiprocessing`` processes: steps per second of a small DDP model (the trained
parameters of both must agree) and gloo all_reduce bandwidth on 16 and 64 MiB (the reduced
values must be right).

    python benchmarks/bench_launch.py [--repeats 5] [--skip-local] [--skip-digits] [--connect]
        [--skip-throughput]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from instruments import close, rank0_forked, refuse, require, require_cold


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


def train_rate(steps: int = 200) -> tuple[float, list[float]]:
    """Steps per second of a small MLP under DDP (gloo), timed inside the rank, and a summary
    of the trained parameters (each tensor's sum), which both launchers must agree on."""
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
    trained = [float(p.detach().double().sum()) for p in net.parameters()]
    dist.destroy_process_group()
    return rate, trained


def allreduce_rate(mib: int, repeats: int = 5) -> tuple[float, list[float]]:
    """GiB/s of gloo all_reduce on a ``mib`` MiB float32 tensor, timed inside the rank, and the
    smallest and largest element after it (2 ** (repeats + 1) everywhere with 2 ranks)."""
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
    reduced = [float(tensor.min()), float(tensor.max())]
    dist.destroy_process_group()
    return repeats * mib / 1024 / seconds, reduced


def _plain_rank(
    index: int, world: int, port: int, fn: Callable[..., Any], args: tuple, out: Any
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


def plain(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on 2 ranks started by torch.multiprocessing; rank 0's value."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_plain_rank, args=(2, port, fn, args, out), nprocs=2, start_method="spawn")
    return out.get()


def _throughput_rows(repeats: int) -> list[tuple[str, float, float]]:
    """Step rate and all-reduce bandwidth of 2 ranks on the driver: runner and plain processes.

    Both sides must have done the same work: the same trained parameters (same seed, same
    data) within a relative 1e-5, and all-reduced values of exactly 2 ** (repeats + 1).
    """
    from sparktrain import SparkRunner

    runner = SparkRunner(np=-2)
    rows = []
    cases: list[tuple[str, Callable[..., Any], tuple[Any, ...], list[float] | None]] = [
        ("DDP MLP, steps/s", train_rate, (), None),
        ("all_reduce 16 MiB, GiB/s", allreduce_rate, (16,), [64.0, 64.0]),
        ("all_reduce 64 MiB, GiB/s", allreduce_rate, (64,), [64.0, 64.0]),
    ]
    for name, fn, args, expect in cases:
        ours, theirs = [], []
        for _ in range(max(3, repeats // 2)):  # interleaved, so drift hits both alike
            our_rate, our_work = runner.run(fn, *args)
            plain_rate, plain_work = plain(fn, *args)
            want = plain_work if expect is None else expect
            require(
                close(our_work, want, rel=1e-5) and close(plain_work, want, rel=1e-5),
                f"{name}: sparktrain's ranks computed {our_work}, plain processes "
                f"{plain_work}, expected {want}",
            )
            ours.append(float(our_rate))
            theirs.append(float(plain_rate))
        rows.append((name, statistics.median(ours), statistics.median(theirs)))
    return rows


def _print_throughput(rows: list[tuple[str, float, float]]) -> None:
    if not rows:
        return
    print("\nthroughput with 2 ranks on the driver, warm (medians; ratio = sparktrain / plain)")
    print(f"  {'what':<26} {'sparktrain':>10} {'plain torch.mp':>14} {'ratio':>6}")
    for name, ours, theirs in rows:
        print(f"  {name:<26} {ours:>10.2f} {theirs:>14.2f} {ours / theirs:>5.2f}x")


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def check_value(what: str, value: Any, expect: Callable[[Any], bool]) -> None:
    """Stop unless the call returned what only a finished run of the function returns."""
    require(expect(value), f"{what} returned {value!r}: the work differs from what was asked")


@dataclasses.dataclass
class Cell:
    """One runner measured on one function: its cold call and its warm calls."""

    cold: float
    warm: list[float]
    forked: int = 0  # warm calls whose rank 0 was forked from a zygote

    @property
    def median(self) -> float:
        return statistics.median(self.warm)


# Warm TorchDistributor calls that failed on their own and were retried once (printed).
PEER_FAILURES: list[str] = []


def measure_warm(
    what: str,
    call: Callable[[], Any],
    repeats: int,
    expect: Callable[[Any], bool],
    runner: Any = None,
    steps: list[dict[str, float]] | None = None,
) -> tuple[list[float], int]:
    """Each warm call's seconds, and in how many rank 0 was forked (from ``runner``'s record);
    with ``steps``, each warm call's phases are appended to it."""
    warm, forked = [], 0
    for _ in range(repeats):
        try:
            seconds, value = timed(call)
        except Exception as error:  # noqa: BLE001 - the peer's own failure, said and retried
            if runner is not None:
                raise  # sparktrain's failures are never retried
            # TorchDistributor picks a free port, then binds it later: on a busy machine
            # another process can take it first (EADDRINUSE). That call measured nothing.
            PEER_FAILURES.append(f"{what}: {type(error).__name__}")
            print(f"(retrying a failed peer call: {what}: {error!s:.200})", file=sys.stderr)
            seconds, value = timed(call)
        check_value(what, value, expect)
        warm.append(seconds)
        if runner is not None:
            forked += bool(rank0_forked(runner))
            if steps is not None:
                steps.append(run_steps(runner, seconds))
    return warm, forked


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


def is_rank(value: Any) -> bool:
    return value in (0, 1)


# name -> (function, the check of rank 0's value, the peer's check): TorchDistributor's local
# mode returns whichever rank wrote last (see the notes), so its no-op may return rank 1's.
CASES: dict[str, tuple[Callable[..., Any], Callable[[Any], bool], Callable[[Any], bool]]] = {
    "no-op": (noop, lambda v: v == 0, lambda v: v == 0),
    "gloo + all_reduce": (allreduce, lambda v: v == 3.0, lambda v: v == 3.0),
    "digits, 3 epochs": (digits, lambda v: v is True, lambda v: v is True),
}


def _wait_for_executors(spark: Any, count: int, timeout: float = 120.0) -> None:
    """Wait until ``count`` executors have registered (no Python runs on them meanwhile)."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
    deadline = time.monotonic() + timeout
    while status().size() < count + 1:  # the driver is listed too
        if time.monotonic() > deadline:
            refuse(f"only {status().size() - 1} of {count} executors registered in {timeout}s")
        time.sleep(0.2)


@contextlib.contextmanager
def fresh_classic_session() -> Iterator[Any]:
    """A new SparkSession on new local-cluster executors: no Python worker, no zygote yet."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("bench-launch")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        _wait_for_executors(spark, 2)
        spark.range(2).collect()  # a first job, without Python on the executors
        yield spark
    finally:
        spark.stop()


@contextlib.contextmanager
def fresh_connect_session(prefix: str = "bench-connect-") -> Iterator[Any]:
    """A Connect client of a new Connect server on new local-cluster executors (no Python
    worker, no zygote yet); the server's log is kept in a new ``prefix*`` folder."""
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from tests.connect.server import connect_server, connect_session

    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    log = Path(tempfile.mkdtemp(prefix=prefix)) / "server.log"
    with connect_server("local-cluster[2,1,1024]", conf, log, [str(root)]) as url:
        with connect_session(url) as spark:
            session: Any = spark
            session.range(2).collect()  # the executors register (no Python runs)
            yield session


def both_runners(
    name: str,
    where: str,
    ours: Any,
    peer: Any,
    repeats: int,
    breakdowns: list[tuple[str, list[dict[str, float]]]] | None = None,
) -> tuple[Cell, Cell]:
    """Cold: sparktrain's first call (checked to be a new interpreter), then the peer's; then
    warm calls of each, interleaved by runner so that drift hits both alike."""
    fn, ours_ok, peer_ok = CASES[name]
    what = f"{name}, {where}"
    seconds, value = timed(lambda: ours.run(fn))
    check_value(f"sparktrain, {what}, cold", value, ours_ok)
    require_cold(ours, f"sparktrain, {what}, cold")
    ours_cell = Cell(seconds, [])
    seconds, value = timed(lambda: peer.run(fn))
    check_value(f"TorchDistributor, {what}, cold", value, peer_ok)
    peer_cell = Cell(seconds, [])
    steps: list[dict[str, float]] = []
    for _ in range(repeats):
        warm, forked = measure_warm(
            f"sparktrain, {what}", lambda: ours.run(fn), 1, ours_ok, ours, steps
        )
        ours_cell.warm += warm
        ours_cell.forked += forked
        peer_cell.warm += measure_warm(
            f"TorchDistributor, {what}", lambda: peer.run(fn), 1, peer_ok
        )[0]
    if breakdowns is not None:
        breakdowns.append((what, steps))
    return ours_cell, peer_cell


def local_cold(name: str) -> float:
    """sparktrain's first call with 2 ranks on the driver, in a fresh Python process."""
    done = subprocess.run(
        [sys.executable, __file__, "--cold-local", name],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        refuse(f"the fresh process for the cold {name} on the driver failed:\n{done.stderr}")
    seconds: float = json.loads(lines[-1])["seconds"]
    return seconds


def _cold_local_child(name: str) -> None:
    """In the fresh process: one call, checked, and its seconds as JSON on the last line."""
    from sparktrain import SparkRunner

    fn, ours_ok, _ = CASES[name]
    runner = SparkRunner(np=-2)
    seconds, value = timed(lambda: runner.run(fn))
    check_value(f"sparktrain, {name}, driver, cold", value, ours_ok)
    require_cold(runner, f"sparktrain, {name}, driver, cold")
    print(json.dumps({"seconds": seconds}))


Row = tuple[str, str, Cell, Cell]


def _local_row(
    name: str, repeats: int, breakdowns: list[tuple[str, list[dict[str, float]]]]
) -> Row:
    """2 ranks on the driver: sparktrain's cold call in a fresh process, the rest here."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from sparktrain import SparkRunner

    fn, ours_ok, peer_ok = CASES[name]
    if name == "no-op":
        peer_ok = is_rank  # TorchDistributor's local mode: the last rank to write wins
    what = f"{name}, driver, 2 ranks"
    ours_cell = Cell(local_cold(name), [])
    ours = SparkRunner(np=-2)
    peer = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    seconds, value = timed(lambda: peer.run(fn))
    check_value(f"TorchDistributor, {what}, cold", value, peer_ok)
    peer_cell = Cell(seconds, [])
    steps: list[dict[str, float]] = []
    for _ in range(repeats):
        warm, forked = measure_warm(
            f"sparktrain, {what}", lambda: ours.run(fn), 1, ours_ok, ours, steps
        )
        ours_cell.warm += warm
        ours_cell.forked += forked
        peer_cell.warm += measure_warm(
            f"TorchDistributor, {what}", lambda: peer.run(fn), 1, peer_ok
        )[0]
    breakdowns.append((what, steps))
    return name, "driver, 2 ranks", ours_cell, peer_cell


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm runs per cell")
    parser.add_argument("--skip-local", action="store_true", help="skip the driver-only rows")
    parser.add_argument("--skip-digits", action="store_true", help="skip the digits job's row")
    parser.add_argument(
        "--connect", action="store_true", help="add rows from a Spark Connect session"
    )
    parser.add_argument(
        "--skip-throughput",
        action="store_true",
        help="skip the step-rate and all-reduce bandwidth rows",
    )
    parser.add_argument("--cold-local", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cold_local:
        _cold_local_child(args.cold_local)
        return
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.ml.torch.distributor import TorchDistributor

    from sparktrain import SparkRunner

    rows: list[Row] = []
    breakdowns: list[tuple[str, list[dict[str, float]]]] = []
    names = [n for n in CASES if not (args.skip_digits and n.startswith("digits"))]
    for name in names:
        with fresh_classic_session():
            ours = SparkRunner(np=2)
            peer = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
            cells = both_runners(name, "2 executors", ours, peer, args.repeats, breakdowns)
            rows.append((name, "2 executors", *cells))
    if not args.skip_local:
        # TorchDistributor needs a session even in local mode; its ranks run on the driver.
        with fresh_classic_session():
            for name in ("no-op", "gloo + all_reduce"):
                rows.append(_local_row(name, args.repeats, breakdowns))
    throughput = [] if args.skip_throughput else _throughput_rows(args.repeats)
    if args.connect:
        rows += _connect_rows(args.repeats, breakdowns)

    header = (
        f"{'function':<18} {'where':<22} {'sparktrain cold':>15} {'sparktrain warm':>15} "
        f"{'forked':>6} {'TorchDistributor cold':>21} {'TorchDistributor warm':>21} "
        f"{'warm ratio':>10} {'cold ours/TD':>12}"
    )
    print()
    print(
        f"launch time, seconds (cold: fresh executors or driver process, rank 0 a new "
        f"interpreter, checked; warm: median of {args.repeats} later calls, 'forked' = how "
        "many forked rank 0 from a zygote; ratio = TorchDistributor / sparktrain, higher is "
        "better for sparktrain; cold ours/TD = sparktrain's cold call / TorchDistributor's, "
        "lower is better; every value checked)"
    )
    print(header)
    print("-" * len(header))
    for name, where, ours_cell, peer_cell in rows:
        forked = f"{ours_cell.forked}/{len(ours_cell.warm)}"
        print(
            f"{name:<18} {where:<22} {ours_cell.cold:>15.2f} {ours_cell.median:>15.2f} "
            f"{forked:>6} {peer_cell.cold:>21.2f} {peer_cell.median:>21.2f} "
            f"{peer_cell.median / ours_cell.median:>9.1f}x "
            f"{ours_cell.cold / peer_cell.cold:>11.2f}x"
        )
    if PEER_FAILURES:
        print(f"warm TorchDistributor calls retried after failing: {PEER_FAILURES}")
    _print_connect_ratios(rows)
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


def _print_connect_ratios(rows: list[Row]) -> None:
    """sparktrain's warm call from a Connect session against the same call from a classic one."""
    classic = {name: ours for name, where, ours, _ in rows if where == "2 executors"}
    connect = {name: ours for name, where, ours, _ in rows if where == "2 executors, Connect"}
    for name in (n for n in connect if n in classic):
        ratio = connect[name].median / classic[name].median
        print(f"sparktrain warm, Connect / classic, {name}: {ratio:.2f}x")


def _connect_rows(
    repeats: int, breakdowns: list[tuple[str, list[dict[str, float]]]] | None = None
) -> list[Row]:
    """The two functions from a Spark Connect session, through both runners; each function on
    a fresh Connect server (its own executors), so that its cold call is cold."""

    from pyspark.ml.torch.distributor import TorchDistributor

    from sparktrain import SparkRunner

    rows: list[Row] = []
    for name in ("no-op", "gloo + all_reduce"):
        with fresh_connect_session() as spark:
            ours = SparkRunner(np=2, spark=spark)
            peer = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
            cells = both_runners(name, "2 executors, Connect", ours, peer, repeats, breakdowns)
            rows.append((name, "2 executors, Connect", *cells))
    return rows


if __name__ == "__main__":
    main()
