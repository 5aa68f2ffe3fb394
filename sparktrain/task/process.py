"""Own one rank's process: start it in its own session, pump its output, stop it for sure."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

from sparktrain import contract
from sparktrain.stacks import Stack
from sparktrain.task.stackpipe import StackPipe
from sparktrain.task.zygote_client import ForkedRank, Zygote, ZygoteGone

TAIL_LINES = 100
# How long a rank gets to dump its stack before it is stopped anyway.
STACK_WAIT = 3.0


def _fork(zygote: Zygote, env: Mapping[str, str], cwd: str, fds: list[int]) -> ForkedRank | None:
    """The worker forked from ``zygote``, its output on a new pipe; None if the zygote is gone."""
    out_read, out_write = os.pipe()
    try:
        rank = zygote.fork(env, cwd, [out_write, *fds])
    except ZygoteGone:
        os.close(out_read)
        return None
    except BaseException:
        os.close(out_read)
        raise
    finally:
        os.close(out_write)
    rank.stdout = os.fdopen(out_read, "rb")
    return rank


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class RankProcess:
    """One rank's worker process.

    The process leads its own session, so it and everything it starts form one process group
    that :meth:`stop` signals as a whole. It holds the read end of a pipe whose write end only
    this supervisor has: when the supervisor dies, the read sees EOF and the worker kills its
    group (see ``sparktrain.worker.bootstrap``), so no rank outlives its task.

    Args:
        rank: the global rank, for messages.
        argv: the command to run.
        env: its complete environment.
        cwd: its working directory.
        on_line: called from the pump thread with each line of output (stdout and stderr).
        on_exit: called from a waiter thread with the exit code once the process has ended.
        dumps_stacks: the process is a sparktrain worker, which dumps its stack on request
            (see :meth:`dump_stack`); other processes are never sent the dump signal.
        zygote: fork the worker from this zygote instead of running ``argv`` (which must
            then be ``python -m sparktrain.worker``); if the zygote has gone, ``argv`` runs.
    """

    def __init__(
        self,
        rank: int,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        on_line: Callable[[int, str], None],
        on_exit: Callable[[int, int], None],
        dumps_stacks: bool = False,
        zygote: Zygote | None = None,
    ) -> None:
        self.rank = rank
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopped_by_supervisor = False
        self.exit_time: float | None = None
        # The stack of the rank's main thread, as last dumped (see dump_stack).
        self.last_stack: Stack | None = None
        self._on_line = on_line
        self._on_exit = on_exit
        self._stacks: StackPipe | None = None
        # Set when the rank (one with GPUs) has answered a stack request with its NCCL trace
        # line (see sparktrain.worker.nccl_trace): it is not stopped before writing it.
        self._trace_note = threading.Event() if env.get(contract.NCCL_TRACE_ENV) else None
        read_end, self._lifeline = os.pipe()
        child_env = {**env, contract.PARENT_FD_ENV: str(read_end)}
        child_fds = [read_end]
        stack_read = stack_write = -1
        if dumps_stacks:
            stack_read, stack_write = os.pipe()
            child_env[contract.STACK_FD_ENV] = str(stack_write)
            child_fds.append(stack_write)
        # Whether the worker was forked from a warm zygote (see sparktrain.task.zygotes), and
        # when it was asked for (wall clock).
        self.forked = False
        self.spawn_time = time.time()
        try:
            self.proc: subprocess.Popen[bytes] | ForkedRank
            forked = _fork(zygote, child_env, cwd, child_fds) if zygote is not None else None
            if forked is not None:
                self.proc, self.forked = forked, True
            else:
                self.proc = subprocess.Popen(
                    argv,
                    env=child_env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=tuple(child_fds),
                )
        except BaseException:
            os.close(self._lifeline)
            if stack_read >= 0:
                os.close(stack_read)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        if stack_read >= 0:
            self._stacks = StackPipe(stack_read, f"sparktrain-stacks-{rank}")
        self._pump = threading.Thread(target=self._pump_output, daemon=True)
        self._pump.start()
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    @property
    def pid(self) -> int:
        """The worker's pid (also its process group id)."""
        return self.proc.pid

    def _pump_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.tail.append(line)
            if self._trace_note is not None and line.startswith(contract.NCCL_TRACE_NOTE):
                self._trace_note.set()
            try:
                self._on_line(self.rank, line)
            except Exception:  # noqa: BLE001 - logs are best-effort, never fatal
                pass
        self.proc.stdout.close()

    def _wait(self) -> None:
        code = self.proc.wait()
        self.exit_time = time.time()
        # The group may still hold children the worker started; they go with it.
        _signal_group(self.proc.pid, signal.SIGKILL)
        self._pump.join(timeout=5)
        os.close(self._lifeline)
        self._on_exit(self.rank, code)

    def _send_dump_signal(self) -> bool:
        if self.proc.poll() is not None:
            return False
        # The worker alone, not its group: its own children have no handler for the signal.
        self.proc.send_signal(contract.STACK_SIGNAL)
        return True

    def dump_stack(self, timeout: float = STACK_WAIT) -> Stack | None:
        """The stack of the rank's main thread now (kept in :attr:`last_stack`), or None.

        Waits at most ``timeout`` seconds, within which a rank with GPUs also writes its NCCL
        flight recorder trace (see :mod:`sparktrain.worker.nccl_trace`). None when the process
        cannot dump (not a worker, not started far enough, or already ended) or did not in time.
        """
        if self._stacks is None or self.proc.poll() is not None:
            return None
        deadline = time.monotonic() + timeout
        if self._trace_note is not None:
            self._trace_note.clear()
        stack = self._stacks.request(self._send_dump_signal, timeout)
        if stack is not None:
            self.last_stack = stack
            if self._trace_note is not None:  # its trace follows its stack, from a thread
                self._trace_note.wait(max(0.0, deadline - time.monotonic()))
        return stack

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds if still alive."""
        if self.proc.poll() is not None:
            return
        self.stopped_by_supervisor = True
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the process has ended and been reaped; True if it has."""
        self._waiter.join(timeout)
        return not self._waiter.is_alive()


def _in_parallel(procs: list[RankProcess], action: Callable[[RankProcess], object]) -> None:
    threads = [threading.Thread(target=action, args=(p,), daemon=True) for p in procs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def dump_all(procs: list[RankProcess], timeout: float = STACK_WAIT) -> dict[int, Stack | None]:
    """Have several processes dump their stacks in parallel (see :meth:`RankProcess.dump_stack`).

    Returns:
        Each process's stack (None: none came), by rank, within about ``timeout`` seconds.
    """
    found: dict[int, Stack | None] = {}

    def dump(proc: RankProcess) -> None:
        found[proc.rank] = proc.dump_stack(timeout)

    _in_parallel(procs, dump)
    return found


def stop_all(procs: list[RankProcess], grace: float, stack_wait: float = 0.0) -> None:
    """Stop several processes in parallel, each with its own grace period.

    Args:
        procs: the processes.
        grace: seconds between SIGTERM and SIGKILL.
        stack_wait: when positive, every process first dumps its stack (at most this long),
            all of them before any is stopped: a rank whose peer is gone would otherwise leave
            the collective it was blocked in before it could tell where that was.
    """
    if stack_wait > 0:
        dump_all(procs, stack_wait)
    _in_parallel(procs, lambda p: p.stop(grace))
