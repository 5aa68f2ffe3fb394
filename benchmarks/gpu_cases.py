"""The cases of ``gpu_suite.py``: each runs in its own process and returns its table rows.

A row is a dict: ``row`` (what is measured, with its unit), ``sparktrain`` and ``peer`` (the
two figures, measured in the same process or the plain process it started), ``peer_name``,
``target`` (``{"kind": "ratio<=" | "ratio>=" | "value<=", "value": x, "text": ...}`` or
None), ``note``, and ``skip`` (why the row has no figures) where it has none. The suite adds
the ratio and whether the target was met.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_workloads as work
from instruments import rank0_forked

SUITE = Path(__file__).resolve().with_name("gpu_suite.py")
PLAIN = "the same function in a fresh plain process"

# Sizes: the on a GPU, tiny for the CPU dry run (which only proves the code paths).
FULL = dict(rows=60_000, test_rows=10_000, epochs=3, batch=512, infer_batch=1024, reps=2)
FULL.update(ckpt_bytes=1 << 30, amp_warmup=20, amp_steps=200, warm_calls=2)
DRY = dict(rows=512, test_rows=256, epochs=1, batch=32, infer_batch=64, reps=1)
DRY.update(ckpt_bytes=1 << 20, amp_warmup=1, amp_steps=3, warm_calls=1)


class Refused(RuntimeError):
    """The work timed is not the work the row compares: the case stops without figures."""


def require(condition: bool, message: str) -> None:
    """Stop the case with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Refused(message)


@dataclasses.dataclass
class Context:
    """What a case knows: sizes, the device, a private scratch folder, its deadline."""

    dry: bool
    scratch: Path
    deadline: float
    began: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def cuda(self) -> bool:
        return not self.dry

    @property
    def size(self) -> dict[str, int]:
        return DRY if self.dry else FULL

    def left(self) -> float:
        """Seconds left before this case's deadline (at least one)."""
        return max(1.0, self.deadline - (time.monotonic() - self.began))

    def runner(self, horovod: bool = False, np: int = -1, warm: bool = False) -> Any:
        """A runner on this machine: NCCL on the GPU, gloo on the CPU for a dry run.

        ``warm=False`` (a case that times one call) loads no zygote after the call, which
        would share the CPUs with what the case measures next.
        """
        from sparktrain import HorovodRunner, SparkRunner

        options = dict(use_gpu=self.cuda, progress=False, timeout=self.left())
        options.update(driver_log_verbosity="log_callback_only", warm_start=warm)
        if self.dry:  # as the plain processes have it (a rank's default: its task's cores)
            options["env"] = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        if horovod:
            return HorovodRunner(np=np, horovod_impl="builtin", **options)
        return SparkRunner(np, **options)

    def plain(self, func: str, spec: dict[str, Any], solo_horovod: bool = False) -> Any:
        """``(run() time, wall seconds, value)`` of ``func(spec)`` in a fresh plain process."""
        with socket.socket() as probe:  # the port of its world-of-one store
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0")
        env.update(WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        if self.dry:
            env["CUDA_VISIBLE_DEVICES"] = ""
        fd, result = tempfile.mkstemp(dir=self.scratch, suffix=".json")
        os.close(fd)
        argv = [sys.executable, str(SUITE), "--plain", func, "--spec", json.dumps(spec)]
        argv += ["--result", result] + (["--solo-horovod"] if solo_horovod else [])
        called, began = time.time(), time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=self.left())
        wall = time.perf_counter() - began
        require(proc.returncode == 0, f"the plain process failed:\n{proc.stderr[-3000:]}")
        return called, wall, json.loads(Path(result).read_text())


def row(name: str, sparktrain: float | None, peer: float | None, **more: Any) -> dict[str, Any]:
    """One table row (see the module's docstring)."""
    out = dict(row=name, sparktrain=sparktrain, peer=peer, peer_name=PLAIN, target=None)
    out.update(note="", skip=None)
    return {**out, **more}


def skipped(name: str, reason: str) -> dict[str, Any]:
    """A row without figures, and why."""
    return row(name, None, None, peer_name="", skip=reason)


def target(kind: str, value: float, text: str) -> dict[str, Any]:
    return {"kind": kind, "value": value, "text": text}


def timed_call(runner: Any, fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
    """``(time.time() at the call, wall seconds, value)`` of one ``runner.run``."""
    called, began = time.time(), time.perf_counter()
    value = runner.run(fn, *args)
    return called, time.perf_counter() - began, value


# --- the seeds' workloads ---------------------------------------------------------------


def seed_case(ctx: Context, workload: str) -> list[dict[str, Any]]:
    """A seed's training function through HorovodRunner(np=-1) and in one plain process."""
    label = {"databricks": "Databricks train_hvd", "alcf": "ALCF torch_hvd_mnist"}[workload]
    spec = dict(workload=workload, cuda=ctx.cuda, log_dir=str(ctx.scratch / "hvd"))
    spec.update({k: ctx.size[k] for k in ("rows", "test_rows", "epochs")})
    runner = ctx.runner(horovod=True)
    _, whole, ours = timed_call(runner, work.seed_workload, spec)
    cold = "cold" if rank0_forked(runner) is False else "rank 0 forked"
    plain_spec = {**spec, "log_dir": str(ctx.scratch / "plain")}
    _, plain_whole, plain = ctx.plain("seed_workload", plain_spec, solo_horovod=True)
    require(ours["steps"] == plain["steps"], f"{label}: {ours['steps']} vs {plain['steps']} steps")
    whole_target = target("value<=", 10.0, "< 10 s") if workload == "databricks" else None
    published = "; published: 49.65 s on one GPU (Databricks)" if workload == "databricks" else ""
    sizes = f"{spec['rows']:,} x 28 x 28, {spec['epochs']} epochs"
    rows = [
        row(
            f"{label}, np=-1: whole call (s)",
            whole,
            plain_whole,
            target=whole_target,
            note=f"{cold} call; {sizes}; function {ours['function_s']:.2f} s{published}",
        ),
        row(
            f"{label}, np=-1: steady step (ms)",
            1e3 * ours["step_s"],
            1e3 * plain["step_s"],
            target=target("ratio<=", 1.05, "<= 1.05x plain"),
            note=f"{ours['steps']} steps",
        ),
    ]
    return rows + _np_k_rows(ctx, label, spec, plain_whole, plain["step_s"])


def _np_k_rows(
    ctx: Context, label: str, spec: dict[str, Any], plain_whole: float, plain_step: float
) -> list[dict[str, Any]]:
    """The same at np=-k, one rank per GPU where k > 1 GPUs exist; two ranks on the CPU
    (gloo) for a dry run, so that the path a machine of several GPUs takes is run here."""
    import torch

    name = f"{label}, np=-k"
    k = 2 if ctx.dry else torch.cuda.device_count()
    if k < 2:
        return [skipped(name, f"{k} GPU here: np=-k needs k > 1 (NCCL: one rank per GPU)")]
    runner = ctx.runner(horovod=True, np=-k)
    _, whole, ours = timed_call(runner, work.seed_workload, spec)
    require(ours["steps"] > 0, f"{name}: rank 0 took no step")
    where = "CPU ranks (gloo)" if ctx.dry else "GPUs, one rank each"
    note = f"k={k} {where}: each rank 1/k of the data"
    return [
        row(f"{name}: whole call (s)", whole, plain_whole, note=note),
        row(f"{name}: steady step (ms)", 1e3 * ours["step_s"], 1e3 * plain_step, note=note),
    ]


# --- time to the first GPU step ---------------------------------------------------------

PARTS = (
    ("launch and interpreter (run() or Popen to the function)", "called", "entered"),
    ("torch import", "entered", "torch"),
    ("CUDA context", "torch", "context"),
    ("communicator (init_process_group, first all-reduce)", "context", "communicator"),
    ("first kernels (CNN to the device, one SGD step)", "communicator", "first_step"),
)


def _zygotes_loaded(seconds: float) -> bool:
    """Wait until the zygotes this process started have loaded, as a later call in a
    session finds them (a call right after the first would wait for the load instead)."""
    from sparktrain.task import zygotes

    started = list(getattr(zygotes, "_zygotes", {}).values())
    return bool(started) and all(zygote.loaded(seconds) for zygote in started)


def first_step_case(ctx: Context) -> list[dict[str, Any]]:
    """``run()`` to the first optimizer step, cold and warm, part by part, against a fresh
    plain process started the way torchrun starts one (every plain start is cold)."""
    spec = {"cuda": ctx.cuda, "batch": ctx.size["batch"]}
    runner = ctx.runner(warm=True)
    calls = []
    for call in range(1 + ctx.size["warm_calls"]):
        loaded = call > 0 and _zygotes_loaded(ctx.left() / 2)
        called, _, stamps = timed_call(runner, work.first_step, spec)
        stamps["called"] = called
        breakdown = runner.last_run.attempts[-1].breakdown
        steps = ", ".join(f"{k} {breakdown[k]:.2f}" for k in ("prepare", "start", "load")
                          if k in breakdown)  # fmt: skip
        how = "forked from a zygote" if rank0_forked(runner) else "a new interpreter"
        note = f"rank 0 {how}{' (zygote loaded)' if loaded else ''}; its record: {steps}"
        calls.append((stamps, rank0_forked(runner), note))
    require(calls[0][1] is False, "the first call's rank 0 was forked: it is not cold")
    called, _, plain = ctx.plain("first_step", spec)
    plain["called"] = called
    script = f"plain: interpreter to the script's first line {plain['entered_script'] - called:.2f}"
    rows = []
    for state, (ours, _, note) in (("cold", calls[0]), ("warm", calls[-1])):
        total = target("value<=", 2.0, "<= 2 s") if state == "warm" else None
        rows.append(
            row(
                f"{state}: run() to the first optimizer step (s)",
                ours["first_step"] - ours["called"],
                plain["first_step"] - plain["called"],
                target=total,
                note="every plain start is cold" if state == "warm" else "",
            )
        )
        for part, start, end in PARTS:
            notes = {PARTS[0][0]: f"{note}; {script}"}
            if ours["torch_preloaded"]:
                notes[PARTS[1][0]] = "torch was imported before the function"
            rows.append(
                row(
                    f"{state}: {part} (s)",
                    ours[end] - ours[start],
                    plain[end] - plain[start],
                    note=notes.get(part, ""),
                )
            )
    return rows


def databricks_case(ctx: Context) -> list[dict[str, Any]]:
    """The Databricks notebook's ``train_hvd``: see :func:`seed_case`."""
    return seed_case(ctx, "databricks")


def alcf_case(ctx: Context) -> list[dict[str, Any]]:
    """The ALCF workshop's ``torch_hvd_mnist`` loop: see :func:`seed_case`."""
    return seed_case(ctx, "alcf")
