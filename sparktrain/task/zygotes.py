"""Warm starts: ranks forked from a process that already imported torch and sparktrain.

The first run of a task's Python process starts its ranks cold, as new interpreters, and
once they have ended a zygote (:mod:`sparktrain.worker.zygote`) with their environment, less
the variables read only once a rank runs; each rank of the later runs with the same
environment is forked from it, ready in milliseconds instead of the seconds a new interpreter
spends importing torch. The zygote loads after the cold ranks, not beside them: loading
torch beside them would take the CPU they need for their own imports and first steps (on a
2-core host it doubled the time a cold rank took to import torch), and a rank that finds its
zygote still loading waits for it (up to :data:`LOAD_WAIT`), which is never slower than a new
interpreter importing the same modules beside it. A task's zygote waits later still, until
the driver has the task's output (its ``hold``, see :mod:`sparktrain.worker.zygote`): the
session's first job ends while it loads otherwise, and on a small host that end, Spark's own
first pass through its result path, then shares the CPU with it. A rank whose environment
differs on any other variable (another ``OMP_NUM_THREADS``, a new ``PYTHONPATH``) gets a
zygote of its own.

A task's Python worker is reused by the other Spark jobs of the session, and some leave
per-call variables in its environment, which the ranks inherit: TorchDistributor's tasks set
a new rendezvous id (and, with a DataFrame, its input files) on every call. From a Spark
Connect session both runners' stages are ``mapInArrow`` jobs sharing the same workers, so
each such call would change the key and start the next run cold. Those variables are read
only by their own job's code once it runs, never while Python, torch and sparktrain load, so
the key leaves them out (:data:`RUNTIME_ONLY`) and a forked rank gets them as they are.

On the driver (``np < 0``) a zygote lives as long as the process that started it; in an
executor, as long as the executor's Python daemon, serving each later Python worker of the
executor (:mod:`sparktrain.task.zygote_share`); either way no longer than ``ZYGOTE_IDLE``
seconds without work. At most
:data:`MAX_ZYGOTES` are kept per process; the oldest idle one goes first, and while every
one kept has ranks running, a rank of yet another environment starts cold.
"""

from __future__ import annotations

import collections
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
from sparktrain.task.zygote_share import Key, share_path
from sparktrain.worker.zygote import MAX_MESSAGE, UNOWNED_IDLE, peer_uid, socket_name
from sparktrain.worker.zygote import usable as loaded_usable

_log = get_logger(__name__)

# Seconds a zygote waits for work before it exits.
ZYGOTE_IDLE = 600.0
# Seconds an executor's zygote waits for a new owner once its last one went away (see
# sparktrain.worker.zygote.UNOWNED_IDLE).
ZYGOTE_UNOWNED = UNOWNED_IDLE
# Zygotes kept per process (one per distinct environment).
MAX_ZYGOTES = 2
# Seconds to wait for a zygote another worker of this executor started to answer (it has
# loaded, so it answers at once unless the machine is starved).
JOIN_WAIT = 10.0
# Seconds a rank waits for its zygote to finish loading before it starts cold instead (and
# that zygote is given up): loading takes what a new interpreter's imports take, so only a
# stuck zygote reaches this.
LOAD_WAIT = 60.0

# Variables other jobs' tasks leave in a reused Python worker and that only their own code
# reads, at run time (TorchDistributor's per-call rendezvous id and input files).
RUNTIME_ONLY = frozenset({"SPARK_PARTITION_ARROW_DATA_FILE", "SPARK_DATAFRAME_SCHEMA_FILE"})
RUNTIME_ONLY_PREFIXES = ("PYSPARK_TORCH_DISTRIBUTOR_",)


class ZygoteGone(OSError):
    """The zygote ended, or cannot fork: start the rank the usual way."""


def read_at_load(name: str) -> bool:
    """Whether a variable may be read while a rank loads (so its zygote must have it)."""
    if contract.late_variable(name):
        return False
    return name not in RUNTIME_ONLY and not name.startswith(RUNTIME_ONLY_PREFIXES)


def import_key(env: Mapping[str, str], cwd: str) -> Key:
    """What a rank's process depends on while it loads: interpreter, folder, early variables."""
    early = tuple(sorted((k, v) for k, v in env.items() if read_at_load(k)))
    return (sys.executable, cwd, early)


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
        env: the environment of the ranks it is for (the late variables are left out).
        cwd: their working directory.
        share: where it takes other owners once loaded (see :func:`share_path`), with the
            pidfd of the process it must not outlive; None: it serves this process alone.
        hold: an fd it waits to see end before it loads (see :mod:`sparktrain.worker.zygote`).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        cwd: str,
        share: tuple[str, int] | None = None,
        hold: int | None = None,
    ) -> None:
        self.key = import_key(env, cwd)
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


_zygotes: collections.OrderedDict[Key, Zygote] = collections.OrderedDict()
_zygotes_lock = threading.Lock()
# Environments whose zygote could not fork (it failed to load, or loaded CUDA or threads):
# their ranks start cold without trying again.
_unusable: set[Key] = set()


def _make_room() -> bool:
    """Let the oldest idle zygotes go until there is room for one more (lock held).

    A zygote whose ranks still run is kept: they are its children, and only it can say how
    they end.

    Returns:
        Whether there is room.
    """
    for key in list(_zygotes):
        if len(_zygotes) < MAX_ZYGOTES:
            break
        if _zygotes[key].idle:
            _zygotes.pop(key).close()
    return len(_zygotes) < MAX_ZYGOTES


def _open(
    env: Mapping[str, str],
    cwd: str,
    key: Key,
    shared: bool,
    start: bool = True,
    hold: int | None = None,
) -> Zygote | None:
    """This executor's zygote for ``key`` when one answers, else a new one when ``start``
    (lock held)."""
    anchor = os.getppid()
    path = share_path(key, anchor) if shared and anchor > 1 and hasattr(os, "pidfd_open") else None
    try:
        if path is not None:
            with contextlib.suppress(OSError):
                return Zygote.join(path, key)
        if not start:
            return None
        if path is not None:
            with contextlib.suppress(OSError):  # no pidfds here (an old kernel, a sandbox)
                pidfd = os.pidfd_open(anchor)
                try:
                    return Zygote(env, cwd, (path, pidfd), hold)
                finally:
                    os.close(pidfd)
        return Zygote(env, cwd, hold=hold)  # it serves this process alone
    except OSError as exc:
        _log.debug("no zygote: %s", exc)
        return None


def zygote_for(
    env: Mapping[str, str],
    cwd: str,
    wait: float = 0.0,
    shared: bool = False,
    start: bool = True,
    hold: int | None = None,
) -> Zygote | None:
    """A loaded zygote for ranks with ``env`` in ``cwd``; one is started if none fits and
    ``start`` says so.

    Args:
        wait: how long to wait for a zygote that is still loading; 0 does not wait (it will
            serve a later call). One not loaded after a ``wait`` above 0 is given up: this
            process's ranks of that environment start cold from then on.
        shared: this process is a Spark executor's Python worker: a zygote of the executor
            (another worker started it) is used where one answers, and one started here
            serves the executor's later workers too, until the executor ends.
        start: start one when none fits (a launcher asks for that once its cold ranks have
            ended, so that it does not load beside them).
        hold: an fd a zygote started now waits to see end before it loads.

    Returns:
        None when no loaded zygote can be had now: start the rank cold.
    """
    key = import_key(env, cwd)
    with _zygotes_lock:
        if key in _unusable:
            return None
        zygote = _zygotes.get(key)
        if zygote is None or zygote.gone:
            if zygote is not None:
                del _zygotes[key]
            if not _make_room():
                return None  # every zygote kept has ranks running: this one starts cold
            found = _open(env, cwd, key, shared, start, hold)
            if found is None:
                return None
            zygote = _zygotes[key] = found
        _zygotes.move_to_end(key)
    # One another process started has loaded: it answers at once.
    if not zygote.loaded(wait if zygote.proc is not None else max(wait, JOIN_WAIT)):
        if wait <= 0:
            return None  # still loading: it will serve a later run
        _log.warning(
            "a zygote (pid %s) did not load within %gs: ranks of this environment start "
            "cold in this process from now on",
            zygote.pid,
            wait,
        )
    elif zygote.usable():
        return zygote
    with _zygotes_lock:
        if _zygotes.get(key) is zygote:
            del _zygotes[key]
        if zygote.info is not None or not zygote.loaded():
            # It loaded and cannot fork, or it is stuck: the same would happen again.
            _unusable.add(key)
    zygote.close()
    return None
