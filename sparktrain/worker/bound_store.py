"""The process group's store of an ``np < 0`` run listens on loopback only.

``init_process_group("env://")`` makes rank 0 start a ``TCPStore`` server, and torch's server
listens on every interface (``*:MASTER_PORT``) whatever ``MASTER_ADDR`` says. The store is
unauthenticated: anyone who reaches the port can read and write the ranks' keys. A run on the
driver alone (``np < 0``) has no reason to be reachable from elsewhere, so there rank 0 binds
the listening socket itself, to ``MASTER_ADDR`` (a loopback address), and hands it to
``TCPStore`` (``master_listen_fd``), torch's own way to serve a store on a socket made by its
caller.

Nothing is imported up front: a finder on ``sys.meta_path`` wraps torch's rendezvous module
when the rank imports it (or at once, where a zygote preloaded it).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

from sparktrain import contract
from sparktrain.worker.import_hooks import PatchOnImport

RENDEZVOUS_MODULE = "torch.distributed.rendezvous"
_FACTORY = "_create_c10d_store"
_BOUND = "_sparktrain_bound"


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` only (not every interface).

    Raises:
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def _bound_factory(create: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create)
    def create_store(
        hostname: str,
        port: int,
        rank: int,
        world_size: int,
        timeout: timedelta,
        use_libuv: bool = True,
    ) -> Any:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        if rank != 0 or agent or os.environ.get(contract.BOUND_STORE_ENV) != "1":
            return create(hostname, port, rank, world_size, timeout, use_libuv)
        from torch.distributed import TCPStore

        sock = listen(hostname, port)
        try:
            # torch serves on this descriptor from now on and closes it with the store.
            return TCPStore(
                host_name=hostname,
                port=port,
                world_size=world_size,
                is_master=True,
                timeout=timeout,
                multi_tenant=True,
                master_listen_fd=sock.detach(),
                use_libuv=use_libuv,
            )
        finally:
            sock.close()  # a no-op once detached

    setattr(create_store, _BOUND, True)
    return create_store


def patch(module: ModuleType) -> None:
    """Wrap ``module``'s store factory (no-op if torch renamed it, or done already)."""
    create = getattr(module, _FACTORY, None)
    if create is None or getattr(create, _BOUND, False):
        return
    setattr(module, _FACTORY, _bound_factory(create))


class RendezvousFinder(PatchOnImport):
    """Wraps torch's store factory once torch's rendezvous module is imported."""

    def __init__(self) -> None:
        super().__init__(frozenset({RENDEZVOUS_MODULE}), patch)


def install() -> None:
    """Bind rank 0's store to ``MASTER_ADDR`` in this process, when the backend asked for it
    (idempotent)."""
    if os.environ.get(contract.BOUND_STORE_ENV) != "1":
        return
    RendezvousFinder().install()
