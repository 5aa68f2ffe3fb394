"""Training speed of sparktrain's built-in horovod.torch against the installed Horovod.

The same Horovod-API training loop (``hvd.DistributedOptimizer``, parameters broadcast from
rank 0, SGD with momentum) runs with 2 ranks under ``horovod_impl="horovod"`` and
``horovod_impl="builtin"``, alternating, and each run reports the steps per second of its
timed steps (after warm-up steps; launch and imports excluded, so whether a rank was cold or
forked warm from a zygote does not enter the rate; the table still says how many were forked,
from each run's record). The table shows the median of each cell and the ratio built-in /
Horovod (target: >= 0.95). The "grouped+async" rows reduce the gradients with one
``hvd.grouped_allreduce_async`` per step and the loss with an ``hvd.allreduce_async`` instead
of ``DistributedOptimizer``: the cost of the collectives called directly.

Both implementations must train alike before a ratio is printed: each rank starts from its
own random weights and trains on its own data, so rank 0's trained parameters depend on the
broadcast and on every allreduce; every run's (a fixed sample of 4096 weights) must be within
a relative L2 distance of 1e-4 (1e-3 with fp16 compression) of the first run's, whichever
implementation ran. Rank 0 trained alone, without communicating, must land more than ten
times that far away, so that the check can tell: an allreduce that skipped communication
would fail it. Either failure stops the benchmark with exit status 1. The Horovod version
printed is the one that ran.

    python benchmarks/bench_hvd_compat.py [--repeats 3] [--steps 60] [--spark] [--only TEXT]

``--spark`` runs the ranks on local-cluster[2,1,1024] executors instead of the driver.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from instruments import rank0_forked, require

# name -> (hidden widths of an MLP on 64 inputs, batch size): a small and a larger model, so
# both per-collective latency and bandwidth show.
# Largest relative distance between two runs' trained parameters (fp32; fp16 compression
# rounds each gradient, and the two implementations may round the sum differently).
TOLERANCE = 1e-4
TOLERANCE_FP16 = 1e-3
MODELS = {
    "mlp-small (9.6k params)": ((128,), 64),
    "mlp-large (4.3M params)": ((2048, 2048), 64),
}


def train(
    widths: tuple[int, ...],
    batch: int,
    steps: int,
    warmup: int,
    fp16: bool,
    communicate: bool = True,
    grouped: bool = False,
) -> dict:
    """Train an MLP on generated data; returns rank 0's steps per second, which hvd ran, its
    version and a sample of its trained parameters.

    Each rank starts from weights of its own seed and trains on data of its own, so rank 0's
    trained parameters depend on the broadcast and on every allreduce. ``communicate=False``
    trains rank 0 alone (plain SGD, no broadcast, no allreduce): the reference that shows
    the check can tell. ``grouped=True`` reduces the gradients with one
    ``grouped_allreduce_async`` per step (and the loss with an ``allreduce_async``) instead of
    ``DistributedOptimizer``.
    """
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(hvd.rank())
    layers: list[torch.nn.Module] = []
    width = 64
    for out in widths:
        layers += [torch.nn.Linear(width, out), torch.nn.ReLU()]
        width = out
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if communicate and not grouped:
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none,
        )
    if communicate:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data = torch.Generator().manual_seed(1000 + hvd.rank())
    x = torch.randn(batch, 64, generator=data)
    y = torch.randint(0, 10, (batch,), generator=data)

    params = list(model.parameters())

    def step() -> None:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if grouped:
            grads = hvd.grouped_allreduce_async([p.grad for p in params], name="grads")
            mean_loss = hvd.allreduce_async(loss.detach(), name="loss")
            for p, reduced in zip(params, hvd.synchronize(grads), strict=True):
                p.grad.copy_(reduced)
            hvd.synchronize(mean_loss)
        optimizer.step()

    for _ in range(warmup):
        step()
    if communicate:
        hvd.allreduce(torch.zeros(1), name="start")  # both ranks start the clock together
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if communicate:
        hvd.allreduce(torch.zeros(1), name="end")
    seconds = time.perf_counter() - start
    try:
        import horovod

        version = str(horovod.__version__)
    except (ImportError, AttributeError):  # the built-in one has no version of its own
        version = "?"
    flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
    picks = torch.linspace(0, flat.numel() - 1, 4096).long()  # a fixed sample of the weights
    return {
        "steps_per_s": steps / seconds,
        "builtin": "sparktrain" in str(hvd.__file__),
        "version": version,
        "params": flat.numel(),
        "trained": flat[picks].tolist(),
        "size": hvd.size(),
    }


def distance(a: list[float], b: list[float]) -> float:
    """Relative L2 distance of two samples of trained parameters."""
    import math

    return math.dist(a, b) / max(math.hypot(*b), 1e-12)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--spark", action="store_true", help="ranks on local-cluster executors")
    parser.add_argument("--only", default="", help="run only the rows whose label contains this")
    args = parser.parse_args(argv)

    import importlib.util

    spec = importlib.util.find_spec("horovod")
    if spec is None or "sparktrain" in str(spec.origin):
        parser.error(
            "Horovod is not installed in this Python: the benchmark compares the built-in "
            "horovod.torch against it (install it with scripts/install-horovod.sh)"
        )
    from sparktrain import SparkRunner

    np = -2
    spark = None
    if args.spark:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local-cluster[2,1,1024]")
            .appName("bench-hvd-compat")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        np = 2

    rows: list[tuple[str, float, float]] = []
    versions: set[str] = set()
    forked = 0
    runs = 0
    checks: list[tuple[str, float, float]] = []
    impls = ("horovod", "builtin")
    cases = [(False, False), (True, False), (False, True)]  # (fp16, grouped)
    for fp16, grouped in cases:
        for name, (widths, batch) in MODELS.items():
            label = f"{name}{', fp16' if fp16 else ''}{', grouped+async' if grouped else ''}"
            if args.only not in label:
                continue
            seen: dict[str, list[float]] = {impl: [] for impl in impls}
            reference: list[float] | None = None
            tolerance = TOLERANCE_FP16 if fp16 else TOLERANCE
            worst = 0.0
            for _ in range(args.repeats):
                for impl in impls:  # alternating, so drift on a shared machine hits both
                    runner = SparkRunner(
                        np=np,
                        backend="horovod",
                        horovod_impl=impl,
                        driver_log_verbosity="log_callback_only",
                        progress=False,
                        spark=spark,
                    )
                    result: dict[str, Any] = runner.run(
                        train, widths, batch, args.steps, args.warmup, fp16, True, grouped
                    )
                    require(
                        result["builtin"] is (impl == "builtin"),
                        f"horovod_impl={impl!r} ran the other implementation",
                    )
                    require(result["size"] == 2, f"{impl} ran {result['size']} ranks, not 2")
                    if reference is None:
                        reference = result["trained"]
                    gap = distance(result["trained"], reference)
                    worst = max(worst, gap)
                    require(
                        gap <= tolerance,
                        f"{label}: horovod_impl={impl!r} trained other parameters than the "
                        f"first run (relative distance {gap:.2e} > {tolerance:g}): the two "
                        "implementations did not do the same work",
                    )
                    if impl == "horovod":
                        versions.add(str(result["version"]))
                    forked += bool(rank0_forked(runner))
                    runs += 1
                    seen[impl].append(result["steps_per_s"])
            # The check can tell: rank 0 trained alone lands far outside the tolerance.
            assert reference is not None
            alone: dict[str, Any] = SparkRunner(
                np=np,
                backend="horovod",
                progress=False,
                spark=spark,
                driver_log_verbosity="log_callback_only",
            ).run(train, widths, batch, args.steps, args.warmup, fp16, False)
            apart = distance(alone["trained"], reference)
            require(
                apart > 10 * tolerance,
                f"{label}: rank 0 trained alone is only {apart:.2e} from the run that "
                f"communicated; the parity check ({tolerance:g}) could not tell them apart",
            )
            checks.append((label, worst, apart))
            rows.append(
                (label, statistics.median(seen["horovod"]), statistics.median(seen["builtin"]))
            )
            print(f"  {label}: horovod {seen['horovod']}, builtin {seen['builtin']}", flush=True)

    where = "local-cluster executors" if args.spark else "the driver"
    version = ", ".join(sorted(versions)) or "?"
    print(f"\n2 ranks on {where}, {args.steps} timed steps, median of {args.repeats} runs")
    print(
        f"(trained parameters agreed in every run; rank 0 forked from a zygote in {forked} of "
        f"{runs} runs, which the timed steps exclude)"
    )
    for label, worst, apart in checks:
        print(
            f"  {label}: runs differ by at most {worst:.1e} (relative L2 of a 4096-weight "
            f"sample); rank 0 trained without communicating is {apart:.1e} away"
        )
    print(f"| model | Horovod {version} steps/s | built-in steps/s | built-in / Horovod |")
    print("|---|---|---|---|")
    for label, theirs, ours in rows:
        print(f"| {label} | {theirs:.1f} | {ours:.1f} | {ours / theirs:.2f}x |")
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
