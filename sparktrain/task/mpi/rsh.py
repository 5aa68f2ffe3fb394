"""mpirun's remote shell without SSH: an agent that asks a barrier task to start the daemon.

``mpirun -mca plm_rsh_agent "python -m sparktrain.task.mpi.rsh"`` runs
``python -m sparktrain.task.mpi.rsh HOST orted ...`` for every other host, as it would run
``ssh HOST orted ...``. The agent connects to the task serving ``HOST`` (its address comes
from :data:`~sparktrain.contract.RSH_PEERS_ENV`; the connection is authenticated with the
run's key, like every other frame of the run), sends the command, relays the daemon's output
to stderr and exits with the daemon's exit code. When mpirun kills the agent, the connection
closes and the task stops the daemon (what sshd does when an ssh session drops).

:class:`~sparktrain.task.mpi.peers.PeerServer` is the task's side: every task of an MPI run
listens on the port it offered at rendezvous, for the agent and for the other tasks of the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from sparktrain import contract, wire
from sparktrain.task.mpi.command import RSH_MODULE, peer_for
from sparktrain.wire import protocol

CONNECT_TIMEOUT = 30.0
CONNECTION_FAILED = contract.EXIT_CONNECTION_FAILED


def main(argv: list[str] | None = None) -> int:
    """``python -m sparktrain.task.mpi.rsh HOST COMMAND...``; returns the remote exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    # mpirun passes plm_rsh_args (none by default) before the host; ssh-style "-x" is harmless.
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2:
        print(f"usage: python -m {RSH_MODULE} HOST COMMAND...", file=sys.stderr)
        return 2
    host, command = args[0], " ".join(args[1:])
    try:
        peers = json.loads(os.environ[contract.RSH_PEERS_ENV])
        key = bytes.fromhex(os.environ[contract.KEY_ENV])
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
        client.send(protocol.RSH(host=host, command=command))
        while True:
            message = client.receive()
            kind = protocol.parse(message, protocol.TO_AGENT)
            if kind is protocol.RSH_OUTPUT:
                sys.stderr.write(f"{message['line']}\n")
                sys.stderr.flush()
            elif kind is protocol.RSH_EXIT:
                return contract.shell_status(message["code"])
    except (OSError, EOFError, wire.FrameError) as exc:
        print(f"sparktrain rsh: lost the task for {host} at {address}: {exc}", file=sys.stderr)
        return CONNECTION_FAILED
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
