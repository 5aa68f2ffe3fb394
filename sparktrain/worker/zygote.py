"""``python -m sparktrain.worker.zygote``: a process that imported torch once and forks ranks.

A new interpreter spends most of a short run importing torch (about 2 s); a process forked
from one that already has is ready in a few milliseconds. The task side
(:mod:`sparktrain.task.zygotes`) starts this server with the environment its ranks will have,
less the variables a rank only reads once it runs (see :func:`late_variable`), and asks it
for each rank over a Unix socket: the rank's complete environment, working directory and
three file descriptors (its output, its lifeline and its stack pipe).

What guarantees that a forked rank behaves like a fresh ``python -m sparktrain.worker``:

* Every variable read while torch and sparktrain load (``OMP_NUM_THREADS``, ``MKL_*``,
  ``PYTHON*``, ``LD_*``, ...) is the same: the owner forks from a server only when the rank's
  environment equals the server's on every variable that is not late.
* The late ones (``RANK``, ``MASTER_ADDR``, ``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, ``GLOO_*``,
  ``HOROVOD_*``, sparktrain's own) are read when CUDA, a process group or Horovod first
  starts, which happens in the user's function; the child sets them before that.
  CUDA must not have been initialised in the server: it says so when it is ready, and the
  owner does not use a server that did.
* The server runs a single Python thread and forks from it; no rank is forked from a thread
  that holds a lock.

A zygote may be given a *hold*: a file descriptor it waits on before loading, until the other
end closes it (or :data:`HOLD_MOST` seconds pass). A task gives its connection to the driver,
which the driver closes once it has the task's output: the seconds of CPU a load takes then
do not slow the end of the Spark job that started it (on a small host the job's last steps
and the load otherwise share the cores).

The server exits after ``_SPARKTRAIN_ZYGOTE_IDLE`` seconds without work, and: when its owner
closes the socket (the owner ended, however it ended); or, shared by an executor's Python
workers, when the executor's Python daemon ends (a pidfd says so), taking each later worker
as an owner on a socket in the user's private folder meanwhile. The ranks it forked lead
their own sessions and are bound to their task by their own lifeline, not to the server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from sparktrain import contract

# Largest request: a rank's environment as JSON.
MAX_MESSAGE = 1 << 20
# Seconds a shared zygote waits for a new owner once its last owner went away: long enough
# for the gap between two runs (Spark stops a worker idle for a minute; another job's task may
# take it), short enough that the zygotes of environments no longer used do not pile up.
UNOWNED_IDLE = 180.0
# Most seconds a zygote waits for its hold to end before it loads anyway (a driver that never
# closed its connection: hung, or cut off without a word).
HOLD_MOST = 30.0
# A Unix socket's name, in bytes, with its terminating NUL (Linux's sun_path).
SOCKET_NAME_MAX = 108


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """One message to the owner (a SOCK_SEQPACKET keeps it whole)."""
    sock.send(json.dumps(message).encode())


def _preload() -> dict[str, Any]:
    """Import what every rank imports; say what the owner needs to know to trust the fork."""
    import sparktrain.worker.bootstrap  # noqa: F401 - the rank's own entry point

    info: dict[str, Any] = {"torch": False, "cuda_initialized": False}
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch
            import torch.distributed  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - the rank will report it when it imports it
            info["error"] = f"{type(exc).__name__}: {exc}"
        else:
            info["torch"] = True
            info["cuda_initialized"] = bool(torch.cuda.is_initialized())
    info["threads"] = _python_threads()
    return info


def _await_release(hold: int, watch: list[int], most: float = HOLD_MOST) -> bool:
    """Wait until ``hold`` ends (EOF or an error; what arrives on it meanwhile is dropped) or
    ``most`` seconds pass; then close it.

    Returns:
        False when one of ``watch`` (the owner's socket, the anchor's pidfd) said first that
        there is no one left to load for.
    """
    deadline = time.monotonic() + most
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            ready, _, _ = select.select([hold, *watch], [], [], left)
            if any(fd in ready for fd in watch):
                return False
            if hold in ready:
                try:
                    if not os.read(hold, 1 << 16):
                        return True
                except OSError:
                    return True
    finally:
        os.close(hold)


def _python_threads() -> int:
    import threading

    return threading.active_count()


def _child(request: dict[str, Any], fds: list[int], closing: list[int]) -> NoReturn:
    """Become the rank: its session, output, environment and folder; then run it."""
    code = contract.EXIT_FAILED
    try:
        os.setsid()
        for fd in closing:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        output, lifeline, *rest = fds
        stacks = rest[0] if rest else -1
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        env = dict(request["env"])
        env[contract.PARENT_FD_ENV] = str(lifeline)
        if stacks >= 0:
            env[contract.STACK_FD_ENV] = str(stacks)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        _fresh_state()
        from sparktrain.worker.bootstrap import exit_rank, main

        exit_rank(main())
    finally:
        os._exit(code)


def _fresh_state() -> None:
    """What a new interpreter would have that a fork shares with its zygote.

    ``random`` reseeds itself after a fork; numpy's global generator does not, so every
    rank (and every run) would draw the same numbers. torch's default generator is seeded
    with a constant in every new interpreter, and the zygote never used it: it is as fresh.
    """
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # loaded by the zygote: its global generator is shared
        numpy_random.seed()
    sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")]


def _reap(children: dict[int, socket.socket | None]) -> None:
    """Tell each ended child's owner how it ended (an owner gone hears nothing)."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        owner = children.pop(pid, None)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if owner is not None:
            try:
                send(owner, {"exit": pid, "code": code})
            except OSError:
                pass  # that owner went away: it no longer waits for the answer


def usable(info: dict[str, Any]) -> bool:
    """Whether ranks may be forked from a zygote that loaded with ``info``."""
    return not (info.get("error") or info.get("cuda_initialized") or info.get("threads", 1) != 1)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


@contextlib.contextmanager
def socket_name(path: str) -> Iterator[str]:
    """``path`` as a Unix socket's name: itself, or where it is too long for one (a deep
    ``TMPDIR``), the same file through ``/proc/self/fd`` and a descriptor of its folder."""
    if len(os.fsencode(path)) < SOCKET_NAME_MAX:
        yield path
        return
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{folder}/{os.path.basename(path)}"
    finally:
        os.close(folder)


class Share:
    """The socket at a path in the user's private folder where a loaded zygote takes owners.

    Bound under a temporary name and renamed into place, so a path that answers is always a
    loaded zygote's. Another zygote renamed over it (two workers started one at once): this
    one then serves its owners and ends with them.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        staging = f"{path}.{os.getpid()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging)
            with socket_name(staging) as name:
                self.sock.bind(name)
            os.chmod(staging, 0o600)
            self.sock.listen(16)
            os.replace(staging, path)
            self.inode = os.stat(path).st_ino
        except OSError:
            self.sock.close()
            with contextlib.suppress(OSError):
                os.unlink(staging)
            raise

    def named(self) -> bool:
        """Whether the path still leads here."""
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def accept(self, hello: dict[str, Any]) -> socket.socket | None:
        """A new owner (this user's processes only), told ``hello``; None if refused."""
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return None
        if peer_uid(conn) != os.getuid():
            conn.close()
            return None
        try:
            send(conn, hello)
        except OSError:
            conn.close()
            return None
        return conn

    def close(self) -> None:
        if self.named():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.sock.close()


def _receive(conn: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """An owner's next request and the fds that came with it; None when it went away."""
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        return (json.loads(data), fds) if data else (None, [])
    except (OSError, ValueError):  # it went away mid-message
        for fd in fds:
            os.close(fd)
        return None, []


def serve(
    owner: socket.socket,
    idle: float,
    share: Share | None = None,
    anchor: int = -1,
    hello: dict[str, Any] | None = None,
    unowned: float = UNOWNED_IDLE,
) -> None:
    """Fork a rank for each request of each owner, until nothing comes for ``idle`` s.

    Unshared, it also ends when its owner goes away. Shared, it takes new owners on
    ``share`` and ends when ``anchor`` (a pidfd) says that process ended, when its last
    owner went away and the path no longer leads to it, or ``unowned`` s after its last
    owner went away when none came since.
    """
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    owners: dict[int, socket.socket] = {owner.fileno(): owner}
    children: dict[int, socket.socket | None] = {}
    last_work = time.monotonic()
    # What it waits on beside its owners and the wake-up pipe; none of it goes to a rank.
    listening = [fd for fd in (share.sock.fileno() if share else -1, anchor) if fd >= 0]
    while owners or (share is not None and share.named()):
        lasts = idle if owners else min(idle, unowned)
        timeout = None if children else max(0.0, last_work + lasts - time.monotonic())
        if timeout == 0.0:
            return
        ready, _, _ = select.select([*owners, wake_read, *listening], [], [], timeout)
        if anchor in ready:
            return  # what it lives no longer than has ended
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(children)
            last_work = time.monotonic()
        if share is not None and share.sock.fileno() in ready:
            conn = share.accept(hello or {})
            if conn is not None:
                owners[conn.fileno()] = conn
        for fd in ready:
            conn = owners.get(fd)
            if conn is None:
                continue
            request, fds = _receive(conn)
            if request is None:
                del owners[fd]  # this owner is gone; its ranks run on
                last_work = time.monotonic()
                for pid, its in children.items():
                    if its is conn:
                        children[pid] = None
                conn.close()
                if share is None:
                    return
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, fds, [*owners, wake_read, wake_write, *listening])
            for received in fds:
                os.close(received)
            children[pid] = conn
            last_work = time.monotonic()
            try:
                send(conn, {"pid": pid})
            except OSError:
                children[pid] = None  # the rank runs on; its owner will see this one gone


def main() -> NoReturn:
    """Load, say ready (and how it went), then serve."""
    fd = int(os.environ.pop(contract.ZYGOTE_FD_ENV))
    idle = float(os.environ.pop(contract.ZYGOTE_IDLE_ENV, "600"))
    path = os.environ.pop(contract.ZYGOTE_SHARE_ENV, "")
    anchor = int(os.environ.pop(contract.ZYGOTE_ANCHOR_FD_ENV, "-1"))
    unowned = float(os.environ.pop(contract.ZYGOTE_UNOWNED_ENV, str(UNOWNED_IDLE)))
    hold = int(os.environ.pop(contract.ZYGOTE_HOLD_FD_ENV, "-1"))
    sock = socket.socket(fileno=fd)
    if hold >= 0:
        # Unshared, it serves its owner alone: an owner gone leaves nothing to load for.
        watch = [fd for fd in (anchor, -1 if path else fd) if fd >= 0]
        if not _await_release(hold, watch):
            os._exit(0)
    info = _preload()
    hello: dict[str, Any] = {"ready": info, "pid": os.getpid()}
    share = None
    if path and anchor >= 0 and usable(info):
        try:
            share = Share(path)
        except OSError:
            pass  # it serves its owner alone
    info["shared"] = share is not None
    send(sock, hello)
    try:
        serve(sock, idle, share, anchor, hello, unowned)
    except (OSError, ValueError):
        pass  # an owner went away mid-message
    finally:
        if share is not None:
            share.close()
    # Nothing to flush or tear down: leave at once (an interpreter that loaded torch can take
    # seconds to tear down on a busy machine, and its owner is already gone).
    os._exit(0)


if __name__ == "__main__":
    main()
