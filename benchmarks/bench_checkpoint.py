"""How long a save blocks the training loop, whole against sharded against asynchronous.

A state of ``--size-mib`` float32 (1 GiB by default) in ``--tensors`` tensors, each split by
rows across the ranks as FSDP shards a parameter (``DTensor`` with ``Shard(0)`` on a CPU mesh,
gloo), is saved ``--saves`` times on each size of ``--ranks`` (4 and 2), the ranks started by
``SparkRunner(np=-k)``, through the code users call:

* (a) ``checkpoint.save(state, dir, step)``: today's whole save; rank 0 first gathers every
  tensor's shards (``dist.gather``) and holds the whole state, as an FSDP user must;
* (b) ``checkpoint.save(state, dir, step, sharded=True)``: every rank writes its own shards;
* (c) ``checkpoint.save(..., sharded=True, asynchronous=True)``: staged, then written in the
  background; its row says "not available" where ``save`` takes no ``asynchronous``
  (found from its signature at run time);
* (d) ``torch.distributed.checkpoint.async_save`` written by hand into a ``FileSystemWriter``
  with ``sync_files=True`` (as (b) and (c) write): the floor.

Per method it prints the time the loop was blocked per save (the median over the saves of the
slowest rank's time in the call; for (a) the gather included), the time until the checkpoint
was durable (for (c) and (d): the call plus waiting for the background write, which the
benchmark waits for outside the timed call, as if training ran meanwhile), the bytes each rank
wrote, and each rank's peak RSS above what the process held before the state was made (after
importing torch and joining the process group), against its shard (the target for a sharded
save: at most the shard plus one staging copy, 2.0x). Then load times: a whole checkpoint read
by rank 0 (``load_latest``), and a sharded one loaded in place on every rank
(``load_latest(dir, into=state)``) at the size that saved it and at another (4 ranks load what 2
saved and 2 what 4 saved). Every load is checked against the values that
were saved, and every save against the bytes the state holds; a mismatch stops the benchmark
with exit status 1 instead of printing a ratio. Times are printed, never asserted.

Peak RSS is the kernel's high-water mark (``VmHWM``), reset before each method through
``/proc/self/clear_refs``; the methods run in the order (b), (c), (d), (a), so rank 0's whole
copy in (a) cannot raise the sharded methods' marks. Files go to a private temporary folder
under ``--dir`` (default: the system's), removed at the end.

    .venv/bin/python benchmarks/bench_checkpoint.py                  # 1 GiB on 4 and 2 ranks
    .venv/bin/python benchmarks/bench_checkpoint.py --size-mib 4096 --ranks 8,4 --saves 5
    .venv/bin/python benchmarks/bench_checkpoint.py --quick          # 8 MiB on 2 and 1 ranks
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from instruments import require

from sparktrain import SparkRunner, checkpoint

METHODS = {
    "a": "(a) whole save",
    "b": "(b) sharded=True",
    "c": "(c) sharded, asynchronous",
    "d": "(d) DCP async_save by hand",
}
ORDER = ["b", "c", "d", "a"]  # (a)'s whole copy on rank 0 last: see the docstring
MIB = 1 << 20


def asynchronous_available() -> bool:
    """Whether ``checkpoint.save`` takes ``asynchronous=`` (it is being added)."""
    return "asynchronous" in inspect.signature(checkpoint.save).parameters


def rank_job(job: dict[str, Any]) -> dict[str, Any]:
    """On every rank: the saves of ``job["methods"]`` and the loads of ``job["loads"]``.

    Self-contained (pickled by value): it uses only torch, the standard library and sparktrain.

    Returns:
        Every rank's measurements, in rank order (rank 0's value is what the run returns).
    """
    import gc
    import shutil
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from sparktrain import checkpoint as ckpt

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return -1

    def reset_peak() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    baseline = status("VmRSS")  # torch, gloo and the mesh: what the process holds anyway
    rows, cols, count = job["rows"], job["cols"], job["tensors"]
    per = rows // world

    def local(index: int, zero: bool) -> torch.Tensor:
        if zero:
            return torch.zeros(per, cols)
        # Row r of tensor i holds r + 7 i everywhere: any resharding error shows on load.
        first = rank * per + 7 * index
        column = torch.arange(first, first + per, dtype=torch.float32).unsqueeze(1)
        return column.expand(per, cols).contiguous()

    def make(zero: bool = False) -> dict[str, Any]:
        shape, stride = torch.Size([rows, cols]), (cols, 1)
        return {
            f"layer{i}.weight": DTensor.from_local(
                local(i, zero), mesh, [Shard(0)], run_check=False, shape=shape, stride=stride
            )
            for i in range(count)
        }

    def check(weights: dict[str, Any], what: str) -> None:
        for i in range(count):
            got = weights[f"layer{i}.weight"]
            got = got.to_local() if isinstance(got, DTensor) else got
            start = rank * per if isinstance(weights[f"layer{i}.weight"], DTensor) else 0
            want = torch.arange(start, start + got.shape[0], dtype=torch.float32) + 7 * i
            if not (torch.equal(got[:, 0], want) and torch.equal(got[:, -1], want)):
                raise RuntimeError(f"{what}: tensor {i} on rank {rank} is not what was saved")

    def own_bytes(folder: Path) -> int:
        if not folder.exists():
            return 0
        total = 0
        for path in folder.rglob("*"):
            sharded = path.name.startswith(f"__{rank}_") or (rank == 0 and path.name == ".metadata")
            whole = rank == 0 and path.suffix == ".pt"
            if path.is_file() and (sharded or whole):
                total += path.stat().st_size
        return total

    def whole_copy(weights: dict[str, Any]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, tensor in weights.items():
            part = tensor.to_local()
            parts = [torch.empty_like(part) for _ in range(world)] if rank == 0 else None
            dist.gather(part, parts, dst=0)
            if parts is not None:
                out[name] = torch.cat(parts)
            del parts
        return out

    state = {"model": make()}
    dist.barrier()
    held = status("VmRSS")
    results: dict[str, Any] = {"rank": rank, "baseline": baseline, "held": held, "methods": {}}
    root = Path(job["root"]) / f"np{world}"
    for method in job["methods"]:
        folder = root / method
        gc.collect()
        dist.barrier()
        reset = reset_peak()
        before = status("VmRSS")
        blocked, durable, gathers = [], [], []
        previous: Path | None = None
        for step in range(job["saves"]):
            dist.barrier()
            start = time.perf_counter()
            handle: Any = None
            if method == "a":
                whole = whole_copy(state["model"])
                gathers.append(time.perf_counter() - start)
                ckpt.save({"model": whole}, folder, step, keep_last=1)
                del whole
            elif method == "b":
                ckpt.save(state, folder, step, keep_last=1, sharded=True)
            elif method == "c":
                handle = ckpt.save(
                    state, folder, step, keep_last=1, sharded=True, asynchronous=True
                )
            else:
                target = folder / f"step-{step}"
                writer = dcp.FileSystemWriter(str(target), sync_files=True)
                handle = dcp.async_save(state, storage_writer=writer)
            blocked.append(time.perf_counter() - start)
            if handle is not None:
                handle.result() if method == "d" else handle.wait()
            durable.append(time.perf_counter() - start)
            dist.barrier()
            if method == "d":
                if previous is not None and rank == 0:
                    shutil.rmtree(previous, ignore_errors=True)
                previous = folder / f"step-{step}"
        gc.collect()
        results["methods"][method] = {
            "blocked": blocked,
            "durable": durable,
            "gather": gathers,
            "bytes": own_bytes(folder),
            "peak": status("VmHWM") if reset else -1,
            "before": before,
        }
    for saved_at in job["loads"]:
        source = Path(job["root"]) / f"np{saved_at}"
        loads: dict[str, float] = {}
        into = {"model": make(zero=True)}
        dist.barrier()
        start = time.perf_counter()
        found = ckpt.load_latest(source / "b", into=into)
        loads["sharded"] = time.perf_counter() - start
        if found is None:
            raise RuntimeError(f"no sharded checkpoint in {source / 'b'}")
        check(into["model"], f"sharded checkpoint of {saved_at} ranks loaded at {world}")
        del into
        dist.barrier()
        if rank == 0:
            start = time.perf_counter()
            loaded = ckpt.load_latest(source / "a", map_location="cpu")
            loads["whole"] = time.perf_counter() - start
            if loaded is None:
                raise RuntimeError(f"no whole checkpoint in {source / 'a'}")
            check(loaded.state["model"], f"whole checkpoint of {saved_at} ranks")
            del loaded
        dist.barrier()
        results.setdefault("loads", {})[saved_at] = loads
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, results)
    dist.destroy_process_group()
    return {"ranks": everyone}


def plan(sizes: list[int]) -> list[tuple[int, bool, list[int]]]:
    """The runs: ``(ranks, save?, sizes whose checkpoints to load)``. Every size saves once,
    loading then what it and the sizes before it saved; a later run per size loads the rest."""
    runs = [(size, True, sizes[: index + 1][::-1]) for index, size in enumerate(sizes)]
    for index, size in enumerate(sizes):
        if sizes[index + 1 :]:
            runs.append((size, False, sizes[index + 1 :]))
    return runs


def layout(size_mib: int, tensors: int, sizes: list[int]) -> tuple[int, int]:
    """Rows and columns per tensor: rows divisible by every size, the total near size_mib."""
    step = 1
    for size in sizes:
        step = step * size // _gcd(step, size)
    cols = 1024
    rows = max(step, round(size_mib * MIB / 4 / cols / tensors / step) * step)
    return rows, cols


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def fmt_mib(value: float) -> str:
    return f"{value / MIB:,.0f}" if value >= 10 * MIB else f"{value / MIB:,.2f}"


def report(
    sizes: list[int], saves: dict[int, list[dict]], loads: dict[int, dict], shard: dict[int, int]
) -> None:
    """Print the tables and the ratios against their targets."""
    have_c = asynchronous_available()
    print(
        "\n| ranks | method | blocked per save (s) | until durable (s) | gather (s) "
        "| MiB written per rank (max) | peak RSS above start per rank, MiB (max) | x shard |"
    )
    print("|---|---|---|---|---|---|---|---|")
    medians: dict[tuple[int, str], float] = {}
    rss_ratio: dict[tuple[int, str], float] = {}
    for size in sizes:
        for method in ["a", "b", "c", "d"]:
            if method == "c" and not have_c:
                print(f"| {size} | {METHODS[method]} | not available | | | | | |")
                continue
            rows = [r["methods"][method] for r in saves[size]]
            per_save = [max(col) for col in zip(*(r["blocked"] for r in rows), strict=True)]
            until = [max(col) for col in zip(*(r["durable"] for r in rows), strict=True)]
            gather = [max(col) for col in zip(*(r["gather"] for r in rows), strict=True)]
            medians[size, method] = statistics.median(per_save)
            peaks = [r["peak"] - s["baseline"] for r, s in zip(rows, saves[size], strict=True)]
            peak = max(peaks) if all(r["peak"] >= 0 for r in rows) else -1
            rss_ratio[size, method] = peak / shard[size] if peak >= 0 else float("nan")
            gathered = f"{statistics.median(gather):.3f}" if gather else ""
            print(
                f"| {size} | {METHODS[method]} | {medians[size, method]:.3f} "
                f"| {statistics.median(until):.3f} | {gathered} "
                f"| {fmt_mib(max(r['bytes'] for r in rows))} "
                f"| {fmt_mib(peak) if peak >= 0 else 'n/a'} "
                f"| {rss_ratio[size, method]:.2f} |"
            )
    print("\n| ranks | ratio | value | target |")
    print("|---|---|---|---|")
    for size in sizes:
        b_over_a = medians[size, "b"] / medians[size, "a"]
        print(f"| {size} | (b)/(a) blocking | {b_over_a:.3f} | |")
        if have_c:
            c_over_a = medians[size, "c"] / medians[size, "a"]
            c_over_d = medians[size, "c"] / medians[size, "d"]
            print(f"| {size} | (c)/(a) blocking | {c_over_a:.3f} | <= 0.1 |")
            print(f"| {size} | (c)/(d) blocking | {c_over_d:.3f} | <= 1.2 |")
        else:
            print(f"| {size} | (c)/(a), (c)/(d) blocking | not available | |")
        for method in ["b", "c"] if have_c else ["b"]:
            print(
                f"| {size} | {METHODS[method]}: peak RSS per rank / its shard "
                f"| {rss_ratio[size, method]:.2f} | <= 2.0 (shard + one staging copy) |"
            )
    print(
        "\n| loaded at (ranks) | saved at (ranks) | whole, rank 0 (s) | sharded, every rank (s) |"
    )
    print("|---|---|---|---|")
    for size in sizes:
        for saved_at, times in loads[size].items():
            print(f"| {size} | {saved_at} | {times['whole']:.3f} | {times['sharded']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="the whole state, MiB")
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--ranks", default="4,2", help="world sizes, e.g. 4,2")
    parser.add_argument("--saves", type=int, default=3, help="saves per method and size")
    parser.add_argument("--dir", default=None, help="where the private temporary folder goes")
    parser.add_argument("--quick", action="store_true", help="8 MiB on 2 and 1 ranks, 2 saves")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.tensors, args.ranks, args.saves = 8, 4, "2,1", 2
    sizes = [int(s) for s in args.ranks.split(",")]
    require(all(s >= 1 for s in sizes) and len(set(sizes)) == len(sizes), "--ranks: distinct >= 1")
    rows, cols = layout(args.size_mib, args.tensors, sizes)
    total = rows * cols * 4 * args.tensors
    methods = [m for m in ORDER if m != "c" or asynchronous_available()]
    print(
        f"state: {args.tensors} float32 tensors of {rows} x {cols}, {fmt_mib(total)} MiB in all, "
        f"sharded by rows (DTensor Shard(0), gloo); {args.saves} saves per method; "
        f"asynchronous=: {'yes' if 'c' in methods else 'not available'}"
    )
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir))
    saves: dict[int, list[dict]] = {}
    loads: dict[int, dict] = {size: {} for size in sizes}
    try:
        for size, save, load_from in plan(sizes):
            job = {
                "root": str(work),
                "rows": rows,
                "cols": cols,
                "tensors": args.tensors,
                "saves": args.saves,
                "methods": methods if save else [],
                "loads": load_from,
            }
            print(f"  {size} rank(s): {'saves, ' if save else ''}loads of {load_from}", flush=True)
            ranks = SparkRunner(np=-size, timeout=3600).run(rank_job, job)["ranks"]
            if save:
                saves[size] = ranks
                for method in methods:
                    written = sum(r["methods"][method]["bytes"] for r in ranks)
                    require(
                        written >= total,
                        f"{METHODS[method]} at {size} ranks wrote {written} bytes, less than "
                        f"the state's {total}",
                    )
            for saved_at, times in ranks[0].get("loads", {}).items():
                loads[size][saved_at] = times | {
                    "sharded": max(r["loads"][saved_at]["sharded"] for r in ranks)
                }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    shard = {size: total // size for size in sizes}
    report(sizes, saves, loads, shard)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (other work on the machine skews)")


if __name__ == "__main__":
    main()
