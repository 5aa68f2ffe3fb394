"""Every GPU figure of sparktrain in one command: one GPU, no Spark, under 8 minutes.

Each case runs in a process of its own under a deadline (a case past it is stopped, recorded
as timed out, and the suite goes on), and each row puts sparktrain's figure beside a plain
or peer figure measured in the same run, with their ratio and the target where there is one:

* ``seeds.databricks``, ``seeds.alcf``: the Databricks HorovodRunner MNIST notebook's
  ``train_hvd`` (3 epochs, batch 100; published 49.65 s on one GPU) and the ALCF workshop's
  ``torch_hvd_mnist`` loop, unchanged, on generated MNIST-sized data (60,000 x 28 x 28),
  through ``HorovodRunner(np=-1)`` with the built-in ``horovod.torch``, against the same
  function in one fresh plain process (``horovod.torch`` a world of one there): whole call
  (target for the notebook: < 10 s) and steady step (target: <= 1.05x plain); the same at
  ``np=-k``, one rank per GPU, where k > 1 GPUs exist (on one GPU its rows say why they have
  no figures; the dry run runs it with two CPU ranks).
* ``first_step``: ``run()`` to the first optimizer step, cold and warm, part by part (launch
  and interpreter, torch import, CUDA context, NCCL communicator, first kernels), from
  timestamps taken inside the rank, against a fresh plain process (warm target: <= 2 s).
* ``loader``: ``make_torch_dataloader`` over a local Parquet folder (written with pyarrow
  and opened with ``SparkDatasetConverter.from_parquet``: no Spark) feeding the CNN at batch
  512, against a ``TensorDataset`` DataLoader with ``pin_memory=True`` (target: >= 0.95x) and
  against tensors already on the GPU; and ``from_dataframe``'s driver-side stream (Arrow
  batches fed to the rank's loader, as a run with ``np < 0`` reads a DataFrame) against the
  pinned DataLoader (target: >= 0.95x).
* ``inference``: the predictor behind ``TorchModel``/``predict_udf`` on ``cuda:0`` against a
  hand-written loop.
* ``checkpoint`` (``gpu_cases_checkpoint.py``): ``sparktrain.checkpoint.save`` of a 1 GiB
  CUDA state, whole against ``torch.save`` with fsync and rename; ``sharded=True`` (a
  one-process gloo group) against the same and against DCP's ``save`` by hand;
  ``asynchronous=True``, its blocking time and its time until durable (``handle.wait()``),
  against ``torch.save``; ``sharded=True, asynchronous=True``, the same two, against DCP's
  ``async_save`` by hand (its call; until ``result()``). Each saved checkpoint is loaded back
  and compared with the state.
* ``mixed_precision``: the CNN under ``torch.autocast(bfloat16)`` in a rank and plain.

On a GPU machine (CUDA torch, no Spark or Java needed), from a checkout of the repository::

    pip install cloudpickle psutil pyarrow fsspec && pip install --no-deps \
        --no-build-isolation -e . && python benchmarks/gpu_suite.py --out gpu-results

Without a package index there, download the wheels on a machine that has one (``pip download
--only-binary :all: --python-version 3.11 -d .whl cloudpickle psutil pyarrow fsspec``, for
the GPU machine's Python), carry ``.whl`` (ignored by git) and install them with ``pip
install --no-index --find-links .whl ...``. The results land in ``gpu-results/``:
``results.json``, ``results.md`` (the table) and ``logs/<case>.log``.

``--dry-run`` runs every case's code path with tiny sizes on the CPU (gloo): the test suite
runs it (``tests/unit/test_gpu_suite.py``), so the script cannot rot while no GPU is there.
``--case NAME`` (repeatable) runs only those cases; ``--deadline NAME=SECONDS`` changes one's
deadline. The cases are in ``gpu_cases.py``, ``gpu_cases_data.py`` and
``gpu_cases_checkpoint.py``, the functions they time (the same in a rank and in a plain
process) in ``gpu_workloads.py``, the table in ``gpu_report.py``. Nothing here asserts a
time. No GPU figure has been measured with it yet.
"""

from __future__ import annotations

import time

_ENTERED = time.time()  # noqa: E402 - a plain process's "interpreter" part ends here

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

BUDGET_S = 450.0  # the cases together; with the start, the whole stays under 8 minutes
DRY_DEADLINE_S = 120.0  # each case of a dry run, on a busy two-core machine
GRACE_S = 15.0  # after SIGTERM, before SIGKILL
PRELOAD = (
    "torch", "cloudpickle", "gpu_cases", "gpu_cases_data", "gpu_cases_checkpoint",
    "torch.distributed.checkpoint", "sparktrain.runner",
    "sparktrain.checkpoint", "sparktrain.data.loader", "sparktrain.inference.predictor",
    "sparktrain.examples.mnist_horovod",
)  # fmt: skip
# Each case: (module, function, deadline on a GPU in seconds). The deadlines add up to 465 s;
# a case gets what is left of BUDGET_S where that is less.
CASES = {
    "seeds.databricks": ("gpu_cases", "databricks_case", 90.0),
    "seeds.alcf": ("gpu_cases", "alcf_case", 90.0),
    "first_step": ("gpu_cases", "first_step_case", 70.0),
    "loader": ("gpu_cases_data", "loader_case", 50.0),
    "inference": ("gpu_cases_data", "inference_case", 30.0),
    "checkpoint": ("gpu_cases_checkpoint", "checkpoint_case", 90.0),
    "mixed_precision": ("gpu_cases_data", "amp_case", 45.0),
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for results.json, results.md, logs/")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, CPU, gloo")
    parser.add_argument("--case", action="append", choices=list(CASES), help="only this case")
    parser.add_argument(
        "--deadline", action="append", default=[], metavar="CASE=SECONDS",
        help="another deadline for a case",
    )  # fmt: skip
    # Internal: a plain process's function.
    parser.add_argument("--plain", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--solo-horovod", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.out is None and not args.plain:
        parser.error("--out FOLDER is required")
    return args


def _plain_main(args: argparse.Namespace) -> None:
    """A plain process: ``gpu_workloads.<plain>(spec)``, its value written as JSON."""
    import gpu_workloads

    if args.solo_horovod:
        gpu_workloads.install_solo_horovod()
    value = getattr(gpu_workloads, args.plain)(json.loads(args.spec))
    if args.plain == "first_step":
        value["entered_script"] = _ENTERED
    args.result.write_text(json.dumps(value))


def _environment(dry: bool) -> dict[str, Any]:
    import torch

    import sparktrain

    cuda = not dry and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "CPU (dry run: gloo, tiny sizes)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sparktrain": sparktrain.__version__,
        "python": sys.version.split()[0],
    }


def _case_main(name: str, dry: bool, scratch: Path, seconds: float, result: Path) -> None:
    """One case, in a process forked for it: its rows (or its error) written to ``result``."""
    import traceback

    import cloudpickle
    import gpu_cases
    import gpu_workloads

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("the case's deadline passed")  # run() then stops its ranks

    signal.signal(signal.SIGTERM, stop)
    cloudpickle.register_pickle_by_value(gpu_workloads)  # the ranks need not import it
    ctx = gpu_cases.Context(dry=dry, scratch=scratch, deadline=seconds)
    out: dict[str, Any] = {"environment": _environment(dry)}
    try:
        module, function, _ = CASES[name]
        out.update(status="ok", rows=getattr(importlib.import_module(module), function)(ctx))
    except BaseException as exc:  # noqa: BLE001 - every failure is a row of the table
        out.update(status="failed", error=f"{type(exc).__name__}: {exc}", rows=[])
        traceback.print_exc()
    result.write_text(json.dumps(out))


def _case_process(log: Path, *case: Any) -> None:
    """The forked process's start: a session of its own, its output to the case's log."""
    os.setsid()
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    _case_main(*case)


def _deadlines(args: argparse.Namespace) -> dict[str, float]:
    chosen = {name: DRY_DEADLINE_S if args.dry_run else CASES[name][2] for name in CASES}
    for item in args.deadline:
        name, _, seconds = item.partition("=")
        if name not in chosen:
            raise SystemExit(f"--deadline {item}: no case {name!r} (cases: {', '.join(chosen)})")
        chosen[name] = float(seconds)
    return chosen


def _stop(proc: Any) -> None:
    """SIGTERM (the case stops its ranks), then SIGKILL to its group after a grace period."""
    proc.terminate()
    proc.join(GRACE_S)
    if proc.is_alive():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # stopped before it had a session of its own
            proc.kill()
        proc.join()


def _run_case(name: str, seconds: float, args: argparse.Namespace, scratch: Path) -> dict:
    """Run one case in a process of its own under ``seconds``; its record for results.json.

    The process is forked from this one, which imported torch and sparktrain but started no
    CUDA context and no thread, so a case does not pay for torch's import again.
    """
    import multiprocessing

    folder = Path(tempfile.mkdtemp(prefix=name + ".", dir=scratch))
    result = folder / "result.json"
    case = (name, args.dry_run, folder, seconds, result)
    began = time.perf_counter()
    proc = multiprocessing.get_context("fork").Process(
        target=_case_process, args=(args.out / "logs" / f"{name}.log", *case), name=name
    )
    proc.start()
    try:
        proc.join(seconds)
    except BaseException:  # Ctrl-C: the case has a session of its own, so it is not told
        _stop(proc)
        raise
    timed_out = proc.is_alive()
    if timed_out:
        _stop(proc)
    record: dict[str, Any] = {"seconds": time.perf_counter() - began, "pid": proc.pid}
    if timed_out:
        record.update(status="timed out", error=f"over its deadline of {seconds:.0f} s", rows=[])
    elif not result.exists():
        record.update(status="failed", error=f"exit status {proc.exitcode}", rows=[])
    else:
        record.update(json.loads(result.read_text()))
    record["deadline"] = seconds
    return record


def _check_gpu() -> None:
    """Refuse to start without a GPU, asking in a child: this process must not touch CUDA
    before it forks the cases."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    if subprocess.run([sys.executable, "-c", probe]).returncode != 0:
        raise SystemExit("no CUDA GPU here (torch.cuda.is_available() is False): "
                         "run it on a GPU machine, or with --dry-run")  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the suite (or, internally, one case or a plain process). Returns the results."""
    args = _parse(argv)
    if args.plain:
        _plain_main(args)
        return {}
    import shutil

    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, whatever this machine has
        os.environ["OMP_NUM_THREADS"] = "1"  # tiny tensors on a busy CPU: threads only spin
    else:
        _check_gpu()
    import gpu_report

    for module in PRELOAD:  # imported once here: each case is forked from this process
        try:
            importlib.import_module(module)
        except ImportError as exc:  # that case fails alone, and its row says why
            print(f"cannot import {module}: {exc}", flush=True)

    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    deadlines = _deadlines(args)
    scratch = Path(tempfile.mkdtemp(prefix="sparktrain-gpu-suite."))
    began = time.monotonic()
    cases: dict[str, Any] = {}
    try:
        for name in args.case or CASES:
            left = BUDGET_S - (time.monotonic() - began)
            if not args.dry_run and left < 10:
                cases[name] = {"status": "not run", "error": "the suite's budget was spent"}
                continue
            seconds = deadlines[name] if args.dry_run else min(deadlines[name], left)
            print(f"{name}: up to {seconds:.0f} s ...", flush=True)
            cases[name] = _run_case(name, seconds, args, scratch)
            print(f"{name}: {cases[name]['status']} in {cases[name]['seconds']:.1f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = gpu_report.assemble(cases, dry=args.dry_run, wall=time.monotonic() - began)
    gpu_report.write(results, args.out)
    print(gpu_report.markdown(results))
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
