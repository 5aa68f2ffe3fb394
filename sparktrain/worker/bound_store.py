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
import importlib.abc
import importlib.machinery
import os
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any

from sparktrain import contract

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


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then :func:`patch`."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ... as the real one
        return getattr(self._loader, name)


class RendezvousFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; hands torch's rendezvous module to a loader that patches it."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != RENDEZVOUS_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Bind rank 0's store to ``MASTER_ADDR`` in this process, when the backend asked for it
    (idempotent)."""
    if os.environ.get(contract.BOUND_STORE_ENV) != "1":
        return
    if RENDEZVOUS_MODULE in sys.modules:
        patch(sys.modules[RENDEZVOUS_MODULE])
    if not any(isinstance(finder, RendezvousFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, RendezvousFinder())
