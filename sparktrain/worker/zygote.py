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

The server exits when its owner closes the socket (the owner ended, however it ended) or after
``_SPARKTRAIN_ZYGOTE_IDLE`` seconds without work; the ranks it forked lead their own sessions
and are bound to their task by their own lifeline, not to the server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from sparktrain import contract

# Largest request: a rank's environment as JSON.
MAX_MESSAGE = 1 << 20


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


def _reap(sock: socket.socket, children: set[int]) -> None:
    """Tell the owner how each ended child ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        send(sock, {"exit": pid, "code": code})


def serve(sock: socket.socket, idle: float) -> None:
    """Fork a rank for each request until the owner goes away or nothing comes for ``idle`` s."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: set[int] = set()
    last_work = time.monotonic()
    while True:
        timeout = None if children else max(0.0, last_work + idle - time.monotonic())
        if timeout == 0.0:
            return
        ready, _, _ = select.select([sock.fileno(), wake_read], [], [], timeout)
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(sock, children)
            last_work = time.monotonic()
        if sock.fileno() not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
        if not data:
            return  # the owner is gone
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, [sock.fileno(), wake_read, wake_write])
        for fd in fds:
            os.close(fd)
        children.add(pid)
        last_work = time.monotonic()
        send(sock, {"pid": pid})


def main() -> NoReturn:
    """Load, say ready (and how it went), then serve."""
    fd = int(os.environ.pop(contract.ZYGOTE_FD_ENV))
    idle = float(os.environ.pop(contract.ZYGOTE_IDLE_ENV, "600"))
    sock = socket.socket(fileno=fd)
    send(sock, {"ready": _preload(), "pid": os.getpid()})
    try:
        serve(sock, idle)
    except (OSError, ValueError):
        pass  # the owner went away mid-message
    # Nothing to flush or tear down: leave at once (an interpreter that loaded torch can take
    # seconds to tear down on a busy machine, and its owner is already gone).
    os._exit(0)


if __name__ == "__main__":
    main()
