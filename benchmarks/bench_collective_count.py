"""What counting a rank's collectives for the hang watch costs, per collective.

Each rank's collectives are wrapped to add one to "entered" and to "completed" in a small
memory-mapped file (``sparktrain.worker.collectives``). This measures, in one process:

* ``no-op``: a wrapped function that does nothing against the bare one: the wrapper's own
  cost, in microseconds per call;
* ``all_reduce``: a blocking ``all_reduce`` of 4 floats on a one-rank Gloo group, wrapped
  against bare (the cheapest real collective there is);
* ``all_reduce async``: the same with ``async_op=True`` and ``wait()`` (its completion is
  counted by a callback on the work's future).

Each line shows the median over the rounds of the extra microseconds per call. Times are
printed, never asserted.

    .venv/bin/python benchmarks/bench_collective_count.py
    .venv/bin/python benchmarks/bench_collective_count.py --calls 20000 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from sparktrain.task.collectives import CollectiveSlots
from sparktrain.worker.collectives import Counters, counted


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Microseconds per call of ``fn``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        slots = CollectiveSlots(Path(folder), [0], lambda message: None, interval=3600)
        counters = Counters(str(slots.paths[0]))
        group = dist.ProcessGroupGloo(dist.FileStore(str(Path(folder) / "store"), 1), 0, 1)
        tensor = torch.ones(4)

        def noop() -> None:
            return None

        def reduce() -> None:
            dist.all_reduce(tensor, group=group)

        def reduce_async() -> None:
            dist.all_reduce(tensor, group=group, async_op=True).wait()  # type: ignore[union-attr]

        cases = {"no-op": noop, "all_reduce": reduce, "all_reduce async": reduce_async}
        print(f"{'case':<18} {'bare µs':>9} {'counted µs':>11} {'extra µs':>9}")
        for name, fn in cases.items():
            wrapped = counted(fn, counters)
            bare, extra = [], []
            for _ in range(args.rounds):
                b = per_call(fn, args.calls)
                w = per_call(wrapped, args.calls)
                bare.append(b)
                extra.append(w - b)
            b, e = statistics.median(bare), statistics.median(extra)
            print(f"{name:<18} {b:>9.2f} {b + e:>11.2f} {e:>9.2f}")
        print(f"counts: {counters.counts()} (entered, completed)")
        slots.close()


if __name__ == "__main__":
    main()
