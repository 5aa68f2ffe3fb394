"""What resuming the DataFrame loader mid-epoch at another world size costs.

On the same files in the same run, each round measures:

* ``plan``: computing one shard's plan of the rest of an epoch that ran at ``--old`` shards
  and goes on at ``--new`` (every old shard's served rows are replayed as index math), against
  the plan of an ordinary epoch at ``--new`` shards;
* ``first batch``: a loader restored from the old shards' states, from ``iter()`` to its first
  batch (planning, reading the first window, skipping nothing), against a fresh loader's;
* ``epoch rest``: the time per row of the restored loader after its first batch, against a
  fresh loader's after its first batch over a whole epoch.

Each line is a ratio against the ordinary case (above 1: the resumed case is slower), the
median over the rounds and their spread. It also prints the state's size as JSON. Times are
printed, never asserted; every resumed read is checked to cover exactly the rows the epoch had
left, so a fast wrong answer cannot be reported.

    .venv/bin/python benchmarks/bench_resume.py
    .venv/bin/python benchmarks/bench_resume.py --rows 2000000 --old 8 --new 3 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from instruments import require

from sparktrain.data import SparkDatasetConverter
from sparktrain.data.resharding import plan_stage


def write(path: Path, rows: int, files: int, row_group: int) -> SparkDatasetConverter:
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for index in range(files):
        ids = np.arange(bounds[index], bounds[index + 1], dtype=np.int64)
        table = pa.table({"id": ids, "x": np.random.default_rng(index).random((ids.size,))})
        pq.write_table(table, path / f"part-{index:03d}.parquet", row_group_size=row_group)
    return SparkDatasetConverter.from_parquet(str(path))


def loader(converter: SparkDatasetConverter, count: int, shard: int, batch: int) -> Any:
    return converter.make_torch_dataloader(
        batch_size=batch, cur_shard=shard, shard_count=count, seed=3, num_epochs=1
    )


def old_states(converter: SparkDatasetConverter, args: argparse.Namespace) -> tuple[list, set]:
    """The states of ``--old`` shards stopped at ``--at`` of the epoch, and the ids they read."""
    states, seen = [], set()
    for shard in range(args.old):
        with loader(converter, args.old, shard, args.batch) as old:
            it = iter(old)
            for _ in range(int(old.batches_per_epoch * args.at)):
                seen.update(next(it)["id"].tolist())
            states.append(old.state_dict())
    return states, seen


def one_round(converter: SparkDatasetConverter, args: argparse.Namespace) -> dict[str, float]:
    states, seen = old_states(converter, args)
    pieces = [rows for _, _, rows in converter.pieces]
    common = dict(batch_size=args.batch, drop_last=False, epoch=0, seed=3, shuffle=True, window=4)
    stages = [(args.old, tuple(s["rows"] for s in states))]
    start = time.perf_counter()
    plan_stage(pieces, stages=[], shard_count=args.new, shard=0, **common)  # type: ignore[arg-type]
    plain_plan = time.perf_counter() - start
    start = time.perf_counter()
    plan_stage(pieces, stages=stages, shard_count=args.new, shard=0, **common)  # type: ignore[arg-type]
    resumed_plan = time.perf_counter() - start

    out: dict[str, float] = {
        "plan": resumed_plan / plain_plan,
        "plan ms (resumed)": resumed_plan * 1e3,
    }
    fresh = loader(converter, args.new, 0, args.batch)
    start = time.perf_counter()
    it = iter(fresh)
    ids = [next(it)["id"]]
    fresh_first = time.perf_counter() - start
    start = time.perf_counter()
    ids += [b["id"] for b in it]
    fresh_rate = sum(len(b) for b in ids[1:]) / (time.perf_counter() - start)
    fresh.close()

    rest: list[int] = []
    first = rate = 0.0
    for shard in range(args.new):
        resumed = loader(converter, args.new, shard, args.batch)
        resumed.load_state_dict(states)
        start = time.perf_counter()
        it = iter(resumed)
        batches = [next(it)["id"]]
        if shard == 0:
            first = time.perf_counter() - start
        start = time.perf_counter()
        batches += [b["id"] for b in it]  # the same work per batch as the fresh loop's
        if shard == 0:
            rate = sum(len(b) for b in batches[1:]) / (time.perf_counter() - start)
        rest += [int(i) for b in batches for i in b]
        resumed.close()
    require(
        set(rest) | seen == set(range(len(converter))) and not set(rest) & seen,
        "the resumed shards did not read exactly the rows the epoch had left",
    )
    out["first batch"] = first / fresh_first
    out["after the first batch, per row"] = fresh_rate / rate
    out["state bytes"] = float(len(json.dumps(states[0])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--old", type=int, default=8)
    parser.add_argument("--new", type=int, default=3)
    parser.add_argument("--at", type=float, default=0.4, help="part of the epoch done")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        converter = write(Path(tmp), args.rows, args.files, args.row_group)
        rounds = [one_round(converter, args) for _ in range(args.rounds)]
    print(
        f"{args.rows} rows, {len(converter.pieces)} row groups, {args.old} -> {args.new} "
        f"shards at {args.at:.0%} of the epoch, batch {args.batch}, {args.rounds} rounds"
    )
    print(f"{'resumed vs ordinary':32} {'median':>8} {'min':>8} {'max':>8}")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        unit = "" if key in ("state bytes", "plan ms (resumed)") else "x"
        print(
            f"{key:32} {statistics.median(values):7.2f}{unit or ' '} "
            f"{min(values):7.2f}{unit or ' '} {max(values):7.2f}{unit or ' '}"
        )


if __name__ == "__main__":
    main()
