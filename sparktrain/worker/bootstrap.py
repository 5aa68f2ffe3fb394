"""``python -m sparktrain.worker``: load the function, pin the device, run it, report.

Outcomes are written to files the supervisor named in the environment: rank 0's pickled
result, or a JSON error record (exception type, message, traceback, phase, time). The exit
code is 0 only when the function returned and, on rank 0, its result was written.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from sparktrain.errors import PayloadError
from sparktrain.payload import dump_result, load_call
from sparktrain.worker import context

PAYLOAD_ENV = "_SPARKTRAIN_PAYLOAD"
RESULT_ENV = "_SPARKTRAIN_RESULT"
ERROR_ENV = "_SPARKTRAIN_ERROR"
MAX_RESULT_ENV = "_SPARKTRAIN_MAX_RESULT"
DEVICE_INDEX_ENV = "_SPARKTRAIN_DEVICE_INDEX"
PARENT_FD_ENV = "_SPARKTRAIN_PARENT_FD"


def _watch_parent() -> None:
    """Kill this process group as soon as the supervisor is gone (its pipe end closes)."""
    fd_text = os.environ.get(PARENT_FD_ENV)
    if not fd_text:
        return
    fd = int(fd_text)

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="sparktrain-parent-watch", daemon=True).start()


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _report_error(phase: str, exc: BaseException, tb: TracebackType | None, user: bool) -> None:
    """Write the error record and echo the traceback to stderr (it reaches the driver's log)."""
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    sys.stderr.write(text)
    sys.stderr.flush()
    path = os.environ.get(ERROR_ENV)
    if path:
        _write_json(
            path,
            {
                "exc_type": type(exc).__name__,
                "message": str(exc),
                "traceback": text,
                "time": time.time(),
                "phase": phase,
                "user_error": user,
            },
        )


def _pin_device() -> None:
    """Make this rank's GPU the current CUDA device, when it has one and CUDA is there."""
    index = os.environ.get(DEVICE_INDEX_ENV)
    if index is None or os.environ.get(context.USE_GPU_ENV) == "0":
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(index))


def _user_frames(exc: BaseException) -> TracebackType | None:
    """The traceback without this module's own frame."""
    tb = exc.__traceback__
    return tb.tb_next if tb is not None and tb.tb_next is not None else tb


def main() -> int:
    """Run one rank; returns the process exit code."""
    _watch_parent()
    try:
        fn, args, kwargs = load_call(Path(os.environ[PAYLOAD_ENV]).read_bytes())
    except Exception as exc:  # noqa: BLE001 - every failure becomes a record
        hint = PayloadError(
            f"could not load the training function on rank {context.rank()}: "
            f"{type(exc).__name__}: {exc}. Modules the function uses must be importable where "
            "the ranks run (install them on the executors, or ship them with sc.addPyFile)."
        )
        _report_error("load", hint, exc.__traceback__, user=False)
        return 1
    try:
        _pin_device()
        value = fn(*args, **kwargs)
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            _report_error("run", exc, _user_frames(exc), user=True)
            return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt included
        _report_error("run", exc, _user_frames(exc), user=True)
        return 1
    result_path = os.environ.get(RESULT_ENV)
    if result_path:
        try:
            data = dump_result(value, int(os.environ.get(MAX_RESULT_ENV, str(256 << 20))))
        except PayloadError as exc:
            _report_error("result", exc, None, user=True)
            return 1
        tmp = f"{result_path}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0
