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

TAIL_LINES = 100


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
    """

    def __init__(
        self,
        rank: int,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        on_line: Callable[[int, str], None],
        on_exit: Callable[[int, int], None],
    ) -> None:
        self.rank = rank
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopped_by_supervisor = False
        self.exit_time: float | None = None
        self._on_line = on_line
        self._on_exit = on_exit
        read_end, self._lifeline = os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv,
                env={**env, contract.PARENT_FD_ENV: str(read_end)},
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(read_end,),
            )
        except BaseException:
            os.close(self._lifeline)
            raise
        finally:
            os.close(read_end)
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


def stop_all(procs: list[RankProcess], grace: float) -> None:
    """Stop several processes in parallel, each with its own grace period."""
    threads = [threading.Thread(target=p.stop, args=(grace,), daemon=True) for p in procs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
