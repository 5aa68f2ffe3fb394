"""The client side of one zygote process: start it (or join one another worker started), ask
it for ranks, hear how they end.

A zygote (:mod:`sparktrain.worker.zygote`) imported torch and sparktrain once and forks ranks
on request; :mod:`sparktrain.task.zygotes` decides which zygote a rank comes from.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from sparktrain import contract
from sparktrain.log import get_logger
from sparktrain.task.zygote_share import Key
from sparktrain.worker.zygote import MAX_MESSAGE, UNOWNED_IDLE, peer_uid, socket_name
from sparktrain.worker.zygote import usable as loaded_usable

_log = get_logger(__name__)

# Seconds a zygote waits for work before it exits.
ZYGOTE_IDLE = 600.0
# Seconds an executor's zygote waits for a new owner once its last one went away (see
# sparktrain.worker.zygote.UNOWNED_IDLE).
ZYGOTE_UNOWNED = UNOWNED_IDLE
# Seconds to wait for a zygote another worker of this executor started to answer (it has
# loaded, so it answers at once unless the machine is starved).
JOIN_WAIT = 10.0


class ZygoteGone(OSError):
    """The zygote ended, or cannot fork: start the rank the usual way."""


class ForkedRank:
    """A rank forked by a zygote, seen like a :class:`subprocess.Popen` by its supervisor.

    The zygote, its parent, reaps it and says how it ended.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self._ended = threading.Event()

    def ended(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired([f"pid {self.pid}"], timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)


class Zygote:
    """One zygote process and the ranks it forked for this process.

    Args:
        key: what the ranks it is for have in common (see
            :func:`~sparktrain.task.zygotes.import_key`): its interpreter, working directory
            and environment (the variables read while a rank loads).
        share: where it takes other owners once loaded (see :func:`share_path`), with the
            pidfd of the process it must not outlive; None: it serves this process alone.
        hold: an fd it waits to see end before it loads (see :mod:`sparktrain.worker.zygote`).
    """

    def __init__(
        self, key: Key, share: tuple[str, int] | None = None, hold: int | None = None
    ) -> None:
        self.key = key
        cwd = key[1]
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        early = dict(self.key[2])
        early[contract.ZYGOTE_FD_ENV] = str(theirs.fileno())
        early[contract.ZYGOTE_IDLE_ENV] = str(ZYGOTE_IDLE)
        fds = [theirs.fileno()]
        if share is not None:
            early[contract.ZYGOTE_SHARE_ENV] = share[0]
            early[contract.ZYGOTE_ANCHOR_FD_ENV] = str(share[1])
            early[contract.ZYGOTE_UNOWNED_ENV] = str(ZYGOTE_UNOWNED)
            fds.append(share[1])
        if hold is not None:
            early[contract.ZYGOTE_HOLD_FD_ENV] = str(hold)
            fds.append(hold)
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "sparktrain.worker.zygote"],
                env=early,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=fds,
            )
        except BaseException:
            self._sock.close()
            raise
        finally:
            theirs.close()
        self._start()

    @classmethod
    def join(cls, path: str, key: Key) -> Zygote:
        """The loaded zygote another process of this executor started, at ``path``.

        Raises:
            OSError: none answers there, or it is not this user's.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(JOIN_WAIT)
            with socket_name(path) as name:
                sock.connect(name)
            if peer_uid(sock) != os.getuid():
                raise PermissionError(f"{path} is served by another account")
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        zygote = object.__new__(cls)
        zygote.key, zygote._sock, zygote.proc = key, sock, None
        zygote._start()
        return zygote

    def _start(self) -> None:
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE * 2)
        self.info: dict[str, Any] | None = None
        self.pid: int | None = self.proc.pid if self.proc is not None else None
        self.gone = False
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ranks: dict[int, ForkedRank] = {}
        threading.Thread(target=self._read, name="sparktrain-zygote", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                if "ready" in message:
                    self.info = message["ready"]
                    self.pid = message.get("pid", self.pid)
                    self._ready.set()
                elif "pid" in message:
                    rank = self._ranks[message["pid"]] = ForkedRank(message["pid"])
                    self._replies.put({"rank": rank})
                elif "exit" in message:
                    found = self._ranks.pop(message["exit"], None)
                    if found is not None:
                        found.ended(int(message["code"]))
        except (OSError, ValueError):
            pass
        self._lost()

    def _lost(self) -> None:
        """The zygote ended: no exit code will come for its ranks, so they are ended here."""
        self.gone = True
        self._ready.set()
        self._replies.put(None)
        for pid, rank in list(self._ranks.items()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            rank.ended(-signal.SIGKILL)
        self._ranks.clear()
        with contextlib.suppress(OSError):
            self._sock.close()
        if self.proc is None:
            return  # another process's child: it reaps it
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            # Its socket ended but it has not: stuck (or starved on a busy host). It runs in a
            # session of its own, so end that and reap it, rather than leave it behind.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    @property
    def idle(self) -> bool:
        """Whether none of the ranks it forked is still running."""
        return not self._ranks

    def loaded(self, timeout: float = 0.0) -> bool:
        """Whether it has finished loading (or ended), waiting at most ``timeout`` s."""
        return self._ready.wait(timeout) if timeout > 0 else self._ready.is_set()

    def usable(self) -> bool:
        """Whether ranks may be forked from it (it has loaded, without CUDA or threads)."""
        if self.gone or self.info is None:
            return False
        if not loaded_usable(self.info):
            _log.debug("zygote %s cannot fork ranks: %s", self.pid, self.info)
            return False
        return True

    def fork(self, env: Mapping[str, str], cwd: str, fds: Sequence[int]) -> ForkedRank:
        """A new rank with ``env`` in ``cwd``, given ``fds``: output, lifeline[, stack pipe].

        Raises:
            ZygoteGone: the zygote has ended or did not answer.
        """
        request = json.dumps({"env": dict(env), "cwd": cwd}).encode()
        with self._lock:
            if self.gone:
                raise ZygoteGone("the zygote has ended")
            try:
                socket.send_fds(self._sock, [request], list(fds))
            except OSError as exc:
                raise ZygoteGone(f"the zygote cannot be reached: {exc}") from exc
            try:
                reply = self._replies.get(timeout=30)
            except queue.Empty:
                reply = None
        if reply is None:
            raise ZygoteGone("the zygote did not fork")
        rank: ForkedRank = reply["rank"]
        return rank

    def close(self) -> None:
        """Let it go: it exits once it sees its socket closed (its ranks run on)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
