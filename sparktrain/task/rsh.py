"""mpirun's remote shell without SSH: an agent that asks a barrier task to start the daemon.

``mpirun -mca plm_rsh_agent "python -m sparktrain.task.rsh"`` runs
``python -m sparktrain.task.rsh HOST orted ...`` for every other host, as it would run
``ssh HOST orted ...``. The agent connects to the task serving ``HOST`` (its address comes
from :data:`~sparktrain.backends.mpi.PEERS_ENV`; the connection is authenticated with the
run's key, like every other frame of the run), sends the command, relays the daemon's output
to stderr and exits with the daemon's exit code. When mpirun kills the agent, the connection
closes and the task stops the daemon (what sshd does when an ssh session drops).

:class:`PeerServer` is the task's side: every task of an MPI run listens on the port it
offered at rendezvous, for the agent and for the other tasks of the run.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from sparktrain import wire
from sparktrain.backends.mpi import PEERS_ENV, peer_for
from sparktrain.worker.context import KEY_ENV

FIRST_FRAME_TIMEOUT = 60.0
CONNECT_TIMEOUT = 30.0
# ssh's exit status when the connection fails; mpirun reports it as a failed daemon launch.
CONNECTION_FAILED = 255

PeerEvent = Callable[[str, int, Any], None]


class PeerServer:
    """An authenticated listener for the other processes of one MPI run.

    Events are handed to ``on_event(kind, conn_id, message)``: ``("peer", id, message)`` for
    each authenticated frame and ``("peer_closed", id, None)`` when an authenticated
    connection ends. Frames that fail authentication drop the connection silently.

    Args:
        key: the run's HMAC key.
        on_event: the callback, called from connection threads.
        bind: address to listen on (default: every interface).
    """

    def __init__(self, key: bytes, on_event: PeerEvent, bind: str = "") -> None:
        self.key = key
        self._on_event = on_event
        self._sock = socket.create_server((bind, 0), backlog=64)
        self._conns: dict[int, tuple[socket.socket, bytes, threading.Lock, list[int]]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        threading.Thread(target=self._accept, name="sparktrain-peers", daemon=True).start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._sock.getsockname()[1])

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            conn_id = next(self._ids)
            threading.Thread(target=self._serve, args=(conn_id, sock), daemon=True).start()

    def _serve(self, conn_id: int, sock: socket.socket) -> None:
        nonce = os.urandom(wire.NONCE_BYTES)
        authenticated = False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(nonce)
            sock.settimeout(FIRST_FRAME_TIMEOUT)
            for seq in itertools.count():
                message = wire.read_frame(sock, self.key, nonce, wire.TO_SERVER, seq)
                if not authenticated:
                    authenticated = True
                    sock.settimeout(None)
                    with self._lock:
                        self._conns[conn_id] = (sock, nonce, threading.Lock(), [0])
                self._on_event("peer", conn_id, message)
        except (OSError, EOFError, wire.FrameError):
            pass
        finally:
            with self._lock:
                self._conns.pop(conn_id, None)
            try:
                sock.close()
            except OSError:
                pass
            if authenticated and not self._closed:
                self._on_event("peer_closed", conn_id, None)

    def send(self, conn_id: int, message: dict[str, Any]) -> bool:
        """Send to one connection; False when it is gone."""
        with self._lock:
            entry = self._conns.get(conn_id)
        if entry is None:
            return False
        sock, nonce, lock, seq = entry
        try:
            with lock:
                frame = wire.encode(self.key, nonce, wire.TO_CLIENT, seq[0], message)
                seq[0] += 1
                sock.sendall(frame)
            return True
        except (OSError, wire.FrameError):
            return False

    def drop(self, conn_id: int) -> None:
        """Close one connection (its peer sees EOF)."""
        with self._lock:
            entry = self._conns.get(conn_id)
        if entry is not None:
            try:
                entry[0].shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            ids = list(self._conns)
        for conn_id in ids:
            self.drop(conn_id)


def exit_status(code: int) -> int:
    """A process exit code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    """``python -m sparktrain.task.rsh HOST COMMAND...``; returns the remote exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    # mpirun passes plm_rsh_args (none by default) before the host; ssh-style "-x" is harmless.
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2:
        print("usage: python -m sparktrain.task.rsh HOST COMMAND...", file=sys.stderr)
        return 2
    host, command = args[0], " ".join(args[1:])
    try:
        peers = json.loads(os.environ[PEERS_ENV])
        key = bytes.fromhex(os.environ[KEY_ENV])
    except (KeyError, ValueError) as exc:
        print(f"sparktrain rsh: not started by a sparktrain MPI run ({exc})", file=sys.stderr)
        return CONNECTION_FAILED
    address = peer_for(host, peers)
    if address is None:
        print(
            f"sparktrain rsh: no task of this run serves host {host!r} (tasks serve "
            f"{sorted(peers)})",
            file=sys.stderr,
        )
        return CONNECTION_FAILED
    try:
        client = wire.ChannelClient(address, key, timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        print(
            f"sparktrain rsh: cannot reach the task for {host} at {address}: {exc}", file=sys.stderr
        )
        return CONNECTION_FAILED

    def hang_up(signum: int, frame: object) -> None:
        # Closing the connection is the remote side's cue to stop the daemon.
        client.close()
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, hang_up)
    try:
        client.send({"type": "rsh", "host": host, "command": command})
        while True:
            message = client.receive()
            if message.get("type") == "rsh_output":
                sys.stderr.write(f"{message.get('line', '')}\n")
                sys.stderr.flush()
            elif message.get("type") == "rsh_exit":
                return exit_status(int(message.get("code", CONNECTION_FAILED)))
    except (OSError, EOFError, wire.FrameError) as exc:
        print(f"sparktrain rsh: lost the task for {host} at {address}: {exc}", file=sys.stderr)
        return CONNECTION_FAILED
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
