"""torch's NCCL flight recorder trace of this rank, written when its stack is asked for.

On a rank with GPUs (its task sets :data:`sparktrain.contract.NCCL_TRACE_ENV`), torch keeps
its NCCL flight recorder (the task sets ``TORCH_FR_BUFFER_SIZE``, before torch 2.8
``TORCH_NCCL_TRACE_BUFFER_SIZE``, unless the user did):
each process group's last collectives, which one, its sequence number, sizes, and whether it
started and finished. When the supervisor asks for the rank's stack (on a hang, a silence, or
before stopping it), this module writes that trace, where torch has it
(``torch._C._distributed_c10d._dump_nccl_trace``, a pickled dict) and the rank's default
process group is NCCL's, to a file of its own, and prints one line naming it (see
:data:`sparktrain.contract.NCCL_TRACE_NOTE`), which its task waits for before stopping it.
``python -m torch.distributed.flight_recorder.fr_trace`` reads a folder of them.

The file is ``rank-<r>.nccl-trace.pkl`` beside the rank's log under ``log_dir`` when set, else
``<run id>-attempt<n>-rank<r>.nccl-trace.pkl`` in the user's private folder on the host
(``<tmp>/sparktrain-<uid>/nccl-traces``), written whole through a temporary name.

The stack itself is written by faulthandler from its C signal handler; Python code cannot run
there, nor on the main thread while it is blocked (in ``.item()`` behind a hung collective).
So faulthandler chains to Python's own handler, which writes the signal's number to a wakeup
pipe (:func:`signal.set_wakeup_fd`) read by a thread of this module. A rank whose own code
sets another wakeup fd (asyncio's ``add_signal_handler``) writes no trace from then on. Not yet
run on a GPU here: the machines these are tested on have none.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparktrain import contract, private_dir

TRACES = "nccl-traces"


def _ignore(signum: int, frame: Any) -> None:
    """The Python handler of the stack signal: the work is done by the wakeup pipe's reader."""


def install() -> bool:
    """Answer stack requests with the NCCL trace too, where the task asked for it (a rank with
    GPUs); call before faulthandler registers the stack signal, with ``chain=`` what this
    returns (True when Python's handler must be chained to)."""
    if not os.environ.get(contract.NCCL_TRACE_ENV):
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)  # set_wakeup_fd's rule: a full pipe never blocks a handler
    try:
        signal.signal(contract.STACK_SIGNAL, _ignore)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):  # not the main thread: no trace, the stacks still come
        os.close(read)
        os.close(write)
        return False
    if previous != -1:  # someone else's: theirs stays, and no trace is written
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return False
    threading.Thread(target=_serve, args=(read,), name="sparktrain-nccl-trace", daemon=True).start()
    return True


def _serve(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            return
        if not data:
            return
        if int(contract.STACK_SIGNAL) in data:
            answer()


def answer(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Write the rank's NCCL trace and print the line naming it (or why there is none).

    Never raises: a trace is a diagnostic, and the stack request goes on without it.
    """
    try:
        reason, path = "", write_trace(environ)
    except Exception as exc:  # noqa: BLE001 - reported in the line, never fatal
        reason, path = f"it could not be written: {type(exc).__name__}: {exc}", None
    if path is None and not reason:
        reason = _why_none()
    text = f"{contract.NCCL_TRACE_NOTE} " + (
        f"is in {path} (torch's pickled trace; python -m "
        "torch.distributed.flight_recorder.fr_trace reads a folder of them)"
        if path is not None
        else f"is not written: {reason}"
    )
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return path


def _dump_function() -> Any:
    torch = sys.modules.get("torch")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    return getattr(c10d, "_dump_nccl_trace", None)


def _nccl_group() -> bool:
    """Whether this rank's default process group is initialized and runs NCCL."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    return "nccl" in str(dist.get_backend()).lower()


def _why_none() -> str:
    if not _nccl_group():
        return "the rank's process group is not NCCL's (or not initialized yet)"
    return "this torch has no NCCL flight recorder (torch._C._distributed_c10d._dump_nccl_trace)"


def write_trace(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The file the rank's NCCL trace was written to; None where there is none to write (the
    default group is not NCCL's, or torch has no flight recorder)."""
    dump = _dump_function()
    if dump is None or not _nccl_group():
        return None
    data = dump()
    folder, name = trace_place(environ)
    return private_dir.write_new(folder, name, bytes(data))


def trace_place(environ: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """The folder (made when missing) and the file name of this rank's trace."""
    rank = environ.get("RANK", "0")
    logs = environ.get(contract.NCCL_TRACE_DIR_ENV)
    if logs:
        folder = Path(logs)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder, f"rank-{rank}.nccl-trace.pkl"
    attempt = int(environ.get(contract.ATTEMPT_ENV, "0")) + 1
    run_id = environ.get(contract.RUN_ID_ENV, "run")
    folder = private_dir.folder(TRACES)
    return folder, f"{run_id}-attempt{attempt}-rank{rank}.nccl-trace.pkl"
