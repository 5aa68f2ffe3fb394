"""The checkpoint case of ``gpu_suite.py``: whole, sharded and asynchronous saves of a state
of >= 1 GiB on the GPU (1 MiB on the CPU for a dry run), each beside its plain peer measured in
the same process. Rows as in :mod:`gpu_cases`.

The suite runs on one GPU, so the sharded saves run in a world of one: a one-process gloo
group (DCP's asynchronous save needs a CPU backend), which is what the sharded code paths
meet on one GPU of a larger run, less the other ranks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gpu_workloads as work
from gpu_cases import Context, require, row, skipped

PLAIN = "torch.save, fsync, rename"
DCP = "DCP save by hand (FileSystemWriter, sync_files=True)"
DCP_ASYNC = "DCP async_save by hand (FileSystemWriter, sync_files=True)"
# The rows after the whole save's: (measure, method, figure, peer method, peer figure, peer).
LATER = (
    ("sharded save, one rank (s)", "sharded", "durable", "plain", "durable", PLAIN),
    ("sharded save, one rank (s)", "sharded", "durable", "dcp", "durable", DCP),
    ("asynchronous save: blocking (s)", "async", "blocked", "plain", "durable", PLAIN),
    ("asynchronous save: until durable, wait() (s)", "async", "durable", "plain", "durable",
     PLAIN),
    ("asynchronous sharded save: blocking (s)", "async_sharded", "blocked", "dcp_async",
     "blocked", f"{DCP_ASYNC}: its call"),
    ("asynchronous sharded save: until durable, wait() (s)", "async_sharded", "durable",
     "dcp_async", "durable", f"{DCP_ASYNC}: until result()"),
)  # fmt: skip
HOW = {
    "whole": "save(state, dir, step, keep_last=1)",
    "sharded": "save(..., sharded=True)",
    "async": "save(..., asynchronous=True), then handle.wait()",
    "async_sharded": "save(..., sharded=True, asynchronous=True), then handle.wait()",
}


def _state(ctx: Context) -> dict[str, Any]:
    """A state of ``ckpt_bytes`` float32 on the device, in four tensors."""
    import torch

    each = ctx.size["ckpt_bytes"] // 16
    device = work.device_of(ctx.cuda)
    return {"model": {f"layer{i}": torch.randn(each, device=device) for i in range(4)}}


@contextlib.contextmanager
def _world_of_one(scratch: Path) -> Iterator[None]:
    """A one-process gloo group for the sharded saves, destroyed at the end."""
    import torch.distributed as dist

    store = scratch / "group-store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _plain_save(state: Any, folder: Path, step: int) -> None:
    """torch.save as a careful script writes it: a temporary file, fsync, rename (the previous
    step's file removed after, as keep_last=1)."""
    import torch

    partial = folder / f"step-{step}.pt.partial"
    with open(partial, "wb") as out:
        torch.save(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, folder / f"step-{step}.pt")
    (folder / f"step-{step - 1}.pt").unlink(missing_ok=True)


def _saver(method: str, state: Any, folder: Path) -> Callable[[int], Any]:
    """``save(step)`` for one method: None, or a handle to wait for."""
    import torch.distributed.checkpoint as dcp

    import sparktrain.checkpoint as checkpoint

    def by_hand(step: int, asynchronous: bool) -> Any:
        shutil.rmtree(folder / f"step-{step - 1}", ignore_errors=True)  # as keep_last=1
        writer = dcp.FileSystemWriter(str(folder / f"step-{step}"), sync_files=True)
        if asynchronous:
            return dcp.async_save(state, storage_writer=writer)
        dcp.save(state, storage_writer=writer)
        return None

    savers: dict[str, Callable[[int], Any]] = {
        "whole": lambda step: checkpoint.save(state, str(folder), step, keep_last=1),
        "plain": lambda step: _plain_save(state, folder, step),
        "sharded": lambda step: checkpoint.save(
            state, str(folder), step, keep_last=1, sharded=True
        ),
        "dcp": lambda step: by_hand(step, False),
        "async": lambda step: checkpoint.save(
            state, str(folder), step, keep_last=1, asynchronous=True
        ),
        "async_sharded": lambda step: checkpoint.save(
            state, str(folder), step, keep_last=1, sharded=True, asynchronous=True
        ),
        "dcp_async": lambda step: by_hand(step, True),
    }
    return savers[method]


def _wait(method: str, handle: Any) -> None:
    """Until an asynchronous save is durable: sparktrain's ``PendingSave.wait()``, DCP's
    future's ``result()`` (a synchronous save is when its call returns)."""
    if method == "dcp_async":
        handle.result()
    elif method.startswith("async"):
        require(handle.wait() is not None, f"{method}: the committed save has no path")


def _check(method: str, state: dict[str, Any], folder: Path, last: int) -> None:
    """Load what sparktrain saved and compare it with the state (the peers are not read)."""
    import torch

    import sparktrain.checkpoint as checkpoint

    if method not in HOW:
        return
    if "sharded" in method:
        into = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
        found = checkpoint.load_latest(str(folder), into=into)
        loaded = into["model"]
    else:
        found = checkpoint.load_latest(str(folder), map_location="cpu")
        loaded = found.state["model"] if found is not None else {}
    require(found is not None and found.step == last, f"{method}: step {last} is not there")
    for name, tensor in state["model"].items():
        same = torch.equal(loaded[name].to(tensor.device), tensor)
        require(same, f"{method}: {name} loaded back differs from what was saved")


def _measure(ctx: Context, state: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each method's best blocking time (in the call) and time until durable, over reps.

    One method at a time, its folder removed once checked, so the disk holds at most two
    copies of the state.
    """
    times: dict[str, dict[str, float]] = {}
    for method in ("whole", "plain", "sharded", "dcp", "async", "async_sharded", "dcp_async"):
        folder = ctx.scratch / method
        folder.mkdir()
        save = _saver(method, state, folder)
        blocked, durable = [], []
        for step in range(ctx.size["reps"]):
            work.sync(work.device_of(ctx.cuda))
            began = time.perf_counter()
            handle = save(step)
            blocked.append(time.perf_counter() - began)
            _wait(method, handle)
            durable.append(time.perf_counter() - began)
        _check(method, state, folder, ctx.size["reps"] - 1)
        shutil.rmtree(folder)
        times[method] = {"blocked": min(blocked), "durable": min(durable)}
    return times


def checkpoint_case(ctx: Context) -> list[dict[str, Any]]:
    """sparktrain.checkpoint.save of a >= 1 GiB CUDA state, whole, sharded and asynchronous,
    against torch.save + fsync and DCP by hand."""
    size = ctx.size["ckpt_bytes"]
    gib = f"{size / (1 << 30):.3g} GiB"
    device = work.device_of(ctx.cuda)
    whole = f"whole save of a {gib} state on {device} (s)"
    if shutil.disk_usage(ctx.scratch).free < 3 * size:
        why = f"less than {3 * size:,} bytes free"
        return [skipped(whole, why)] + [skipped(measure, why) for measure, *_ in LATER]
    state = _state(ctx)
    with _world_of_one(ctx.scratch):
        times = _measure(ctx, state)
    best = f"best of {ctx.size['reps']}"
    rows = [
        row(
            whole,
            times["whole"]["durable"],
            times["plain"]["durable"],
            peer_name=PLAIN,
            note=f"synchronous: training waits for all of it; {best}",
        )
    ]
    for measure, method, figure, peer, peer_figure, peer_name in LATER:
        note = f"{HOW[method]}; {best}"
        if method.startswith("async"):
            note = f"{HOW[method]}; blocking {times[method]['blocked']:.3g} s, until durable "
            note += f"{times[method]['durable']:.3g} s; {best}"
        rows.append(
            row(
                measure,
                times[method][figure],
                times[peer][peer_figure],
                peer_name=peer_name,
                note=note,
            )
        )
    return rows
