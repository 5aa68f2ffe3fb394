"""``python -m sparktrain.worker``: load the function, pin the device, run it, report.

Outcomes are written to files the supervisor named in the environment: rank 0's pickled
result, or a JSON error record (exception type, message, traceback, phase, time). The exit
code is 0 only when the function returned and, on rank 0, its result was written.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from sparktrain import contract
from sparktrain.errors import PayloadError, SparkTrainError
from sparktrain.shipping.payload import (
    ResultTooLargeError,
    dump_result,
    keep_and_say,
    kept_result_name,
    load_call,
)
from sparktrain.worker import bound_store, collectives, context, frameworks, nccl_trace
from sparktrain.worker.sparkfiles import expose_spark_files

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (mpirun or Open MPI's daemon) dies (Linux)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the launcher's own cleanup has to do
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _adopt_mpi_rank() -> None:
    """Under mpirun: take this rank's sparktrain environment from its host's table.

    mpirun starts every rank of a host with one environment; ``OMPI_COMM_WORLD_RANK`` picks
    this rank's row (``RANK``, ``LOCAL_RANK``, devices, ...) and its outcome file names.
    Ranks started by mpirun cannot inherit the supervisor's lifeline pipe (Open MPI closes
    it), so they die with their launcher instead, which the supervisor owns.

    Raises:
        SparkTrainError: mpirun placed this rank where sparktrain did not expect it.
    """
    table_text = os.environ.get(contract.MPI_RANK_TABLE_ENV)
    if table_text is None or contract.OMPI_RANK_ENV not in os.environ:
        return
    os.environ.pop(contract.PARENT_FD_ENV, None)
    _die_with_parent()
    rank = int(os.environ[contract.OMPI_RANK_ENV])
    folder = os.environ[contract.OUTCOME_DIR_ENV]
    os.environ[contract.ERROR_ENV] = os.path.join(folder, contract.error_file_name(rank))
    if rank == 0:
        os.environ[contract.RESULT_ENV] = os.path.join(folder, contract.RESULT_FILE)
    else:
        os.environ.pop(contract.RESULT_ENV, None)
    # Open MPI starts ranks in mpirun's folder (or $HOME where that is missing): this host's
    # task's own is where they belong.
    cwd = os.environ.get(contract.TASK_CWD_ENV)
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    # The task reaps ranks by these files once their launcher has ended (none outlives it).
    pid_file = os.path.join(folder, contract.pid_file_name(rank))
    with open(f"{pid_file}.tmp", "w", encoding="utf-8") as fh:
        fh.write(str(os.getpid()))
    os.replace(f"{pid_file}.tmp", pid_file)
    table = contract.parse_rank_table(table_text)
    if rank not in table:
        raise SparkTrainError(
            f"mpirun started rank {rank} on a host that runs ranks {sorted(table)}: its host "
            "list does not match the barrier tasks' (hosts known under several names?)"
        )
    os.environ.update(table[rank])
    size = os.environ.get(contract.OMPI_SIZE_ENV)
    if size is not None and size != os.environ.get("WORLD_SIZE"):
        raise SparkTrainError(
            f"mpirun started {size} ranks, sparktrain planned {os.environ.get('WORLD_SIZE')}"
        )


def watch_lifeline(fd: int, grace: float, name: str) -> None:
    """Stop this process group once the supervisor is gone (the pipe end ``fd`` closes).

    Like a preemption: SIGTERM first (ranks using should_stop() may save; mpirun stops its
    ranks), SIGKILL after ``grace`` seconds.
    """

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        group = os.getpgid(0)
        os.killpg(group, signal.SIGTERM)
        threading.Event().wait(grace)
        os.killpg(group, signal.SIGKILL)

    threading.Thread(target=watch, name=name, daemon=True).start()


def _watch_parent() -> None:
    """Kill this process group as soon as the supervisor is gone."""
    fd_text = os.environ.get(contract.PARENT_FD_ENV)
    if fd_text:
        watch_lifeline(
            int(fd_text), float(os.environ.get(contract.GRACE_ENV, "10")), "sparktrain-parent-watch"
        )


def _answer_stack_requests() -> None:
    """Dump every thread's stack into the supervisor's stack pipe on its signal.

    faulthandler writes from its C signal handler, so the dump comes even while the main
    thread is blocked in C (a collective, a sleep). The header line first tells the supervisor
    that the handler is in place (until then the signal would kill this process), which
    thread is the main one, and the main thread's outermost function, the last frame of a
    complete dump of it.
    """
    fd_text = os.environ.pop(contract.STACK_FD_ENV, None)
    if not fd_text:
        return
    fd = int(fd_text)
    os.set_inheritable(fd, False)  # not for the processes the function starts
    frame = sys._getframe()
    while frame.f_back is not None:
        frame = frame.f_back
    # On a rank with GPUs, Python's handler runs after faulthandler's: it wakes the thread
    # that writes the NCCL flight recorder's trace.
    chain = nccl_trace.install()
    faulthandler.register(contract.STACK_SIGNAL, file=fd, all_threads=True, chain=chain)
    try:
        os.write(
            fd,
            contract.stack_header(
                threading.main_thread().ident or 0, frame.f_code.co_name
            ).encode(),
        )
    except OSError:  # the supervisor is gone; the lifeline ends this process
        faulthandler.unregister(contract.STACK_SIGNAL)


def _shadow_horovod() -> None:
    """Make ``import horovod`` give sparktrain's built-in horovod.torch, when the backend says.

    The shim folder goes first on this process's path, and on ``PYTHONPATH`` for the
    processes the function starts; nothing outside the rank is affected.
    """
    if not os.environ.get(contract.HOROVOD_SHIM_ENV):
        return
    shim = str(contract.HOROVOD_SHIM_DIR)
    sys.path.insert(0, shim)
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [shim, inherited]))


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
    path = os.environ.get(contract.ERROR_ENV)
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
    index = os.environ.get(contract.DEVICE_INDEX_ENV)
    if index is None or os.environ.get(contract.USE_GPU_ENV) == "0":
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(index))


def _user_frames(exc: BaseException) -> TracebackType | None:
    """The traceback without this module's own frame."""
    tb = exc.__traceback__
    return tb.tb_next if tb is not None and tb.tb_next is not None else tb


def exit_rank(code: int) -> NoReturn:
    """End the rank's process with ``code`` once it has written everything it owes the driver.

    The atexit handlers users expect run; interpreter teardown does not: destroying
    communication objects (gloo's and NCCL's threads) while a peer has already exited can
    abort the process ("terminate called without an active exception"), turning a finished
    rank into a crashed one.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        logging.shutdown()
        os._exit(code)


def _finish_checkpoint() -> None:
    """Wait for the rank's asynchronous checkpoint save still in flight, if any: its failure
    fails the rank, naming the step (nothing to do when no checkpoint was saved)."""
    background = sys.modules.get("sparktrain.checkpoint._background")
    if background is not None:
        background.finish()


def main() -> int:
    """Run one rank; returns the process exit code."""
    times = {"begun": time.time()}
    try:
        _adopt_mpi_rank()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a record
        _report_error("load", exc, exc.__traceback__, user=False)
        return contract.EXIT_FAILED
    _watch_parent()
    _answer_stack_requests()
    expose_spark_files()
    _shadow_horovod()
    frameworks.install()  # before the payload: unpickling it may import Lightning
    bound_store.install()
    collectives.install()  # for the driver's hang watch
    try:
        payload = Path(os.environ[contract.PAYLOAD_ENV])
        # The user's modules that travelled go beside the payload, in the task's own folder.
        fn, args, kwargs = load_call(payload.read_bytes(), payload.parent)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a record
        hint = PayloadError(
            f"could not load the training function on rank {context.rank()}: "
            f"{type(exc).__name__}: {exc}. Modules the function uses must be importable where "
            "the ranks run: those in the driver's working folder travel with the run "
            "(ship_modules); install others on the executors, or ship them with sc.addPyFile."
        )
        _report_error("load", hint, exc.__traceback__, user=False)
        return 1
    try:
        _pin_device()
        times["called"] = time.time()
        try:
            value = fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
            value = None  # sys.exit(0) ends the function as returning does
        _finish_checkpoint()
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            _report_error("run", exc, _user_frames(exc), user=True)
            return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt included
        _report_error("run", exc, _user_frames(exc), user=True)
        return 1
    times["returned"] = time.time()
    result_path = os.environ.get(contract.RESULT_ENV)
    if result_path and not _write_result(value, result_path):
        return 1
    times["written"] = time.time()
    times_path = os.environ.get(contract.TIMES_ENV)
    if times_path:
        with contextlib.suppress(OSError):
            _write_json(times_path, times)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def _write_result(value: Any, path: str) -> bool:
    """Pickle this rank's value to ``path``; on failure write the error record and say False.

    A value over the limit is not lost: it is kept in a file of its own, which the error
    names.
    """
    try:
        limit = int(os.environ.get(contract.MAX_RESULT_ENV, str(256 << 20)))
        data = dump_result(value, limit, context.rank())
    except ResultTooLargeError as exc:
        _report_error("result", PayloadError(f"{exc}; {_kept(exc.data)}"), None, user=True)
        return False
    except PayloadError as exc:
        _report_error("result", exc, None, user=True)
        return False
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        error = PayloadError(
            f"rank {context.rank()}'s result ({len(data) / (1 << 20):.1f} MiB) could not be written to "
            f"{path}: {exc}; {_kept(data)}"
        )
        _report_error("result", error, None, user=False)
        return False
    return True


def _kept(data: bytes) -> str:
    """Keep a result that cannot be returned, and say where (or that it could not be)."""
    run_id = os.environ.get(contract.RUN_ID_ENV, "run")
    attempt = int(os.environ.get(contract.ATTEMPT_ENV, "0"))
    name = kept_result_name(run_id, attempt, context.rank())
    return keep_and_say(data, name, socket.gethostname())
