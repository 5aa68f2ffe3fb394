"""The port a task offers for rank 0's store stays held until the store listens on it.

The port is offered at rendezvous; rank 0's store binds it seconds later, in another process.
Another program binding that port in between (a notebook kernel choosing its ports, any
service) made rank 0 fail with ``EADDRINUSE`` on a busy host. The task now keeps the port
bound until its ranks end, so that program is refused instead and the run goes on.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.task.rank_launchers import reserve_port

# Binds the port in argv[1] on every interface the way most programs do (no SO_REUSEADDR),
# listens, says what happened, and holds the port until it is killed.
STRANGER = """
import socket, sys, time
sock = socket.socket()
try:
    sock.bind(("", int(sys.argv[1])))
    sock.listen()
except OSError as exc:
    print("refused", exc.errno, flush=True)
    sys.exit(0)
print("bound", flush=True)
time.sleep(600)
"""


def _stranger_takes_the_port_first() -> dict[str, Any]:
    """Rank 0 has another process take MASTER_PORT before the process group starts."""
    import torch
    import torch.distributed as dist

    stranger = None
    said = ""
    if os.environ["RANK"] == "0":
        stranger = subprocess.Popen(
            [sys.executable, "-c", STRANGER, os.environ["MASTER_PORT"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert stranger.stdout is not None
        said = stranger.stdout.readline().strip()
    try:
        dist.init_process_group("gloo")
        total = torch.ones(1)
        dist.all_reduce(total)
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
    return {"stranger": said, "total": total.item()}


def test_a_program_binding_the_offered_port_is_refused_and_the_run_goes_on() -> None:
    seen = SparkRunner(np=-2, progress=False).run(_stranger_takes_the_port_first)
    assert seen["stranger"] == f"refused {errno.EADDRINUSE}"
    assert seen["total"] == 2.0


@pytest.mark.parametrize("stranger", ["0.0.0.0", "127.0.0.1", "::1"])
def test_the_held_port_is_held_on_every_address(stranger: str) -> None:
    # Torch's store listens on every interface: a port held on one address alone could be
    # another listener's on loopback, and the store would fail there.
    held = reserve_port()
    port = held.getsockname()[1]
    family = socket.AF_INET6 if ":" in stranger else socket.AF_INET
    try:
        with socket.socket(family) as other:
            try:
                other.bind((stranger, port))
            except OSError as exc:
                refused = exc.errno
            else:
                refused = 0
    except OSError:
        pytest.skip(f"no {stranger} on this host")
    finally:
        held.close()
    if refused == errno.EADDRNOTAVAIL:
        pytest.skip(f"no {stranger} on this host")
    assert refused == errno.EADDRINUSE


def test_the_held_port_is_free_for_a_listener_that_reuses_addresses() -> None:
    held = reserve_port()
    port = held.getsockname()[1]
    try:
        with socket.socket() as plain:
            refused = plain.connect_ex(("127.0.0.1", port))
        store = socket.socket()
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", port))
        store.listen()
        with store, socket.create_connection(("127.0.0.1", port), timeout=10):
            conn, _ = store.accept()
            conn.close()
    finally:
        held.close()
    # Nothing listens on a held port until the store does.
    assert refused != 0
