"""Where a server of the run listens: on the one address its peers use, when that is this
machine's, rather than on every interface.

The driver's channel is reached at ``spark.driver.host``, an MPI task's peer server at the
host the task offered at rendezvous. Listening on that address alone keeps the port off the
machine's other networks. When the address is not surely one of this machine's (a name that
resolves to several addresses, or to none of ours, as behind NAT or a container's published
address), the server listens where it would have without it: the caller's fallback.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection, Sequence


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def choose_listen_address(
    host: str, resolved: Sequence[str], local: Collection[str], fallback: str
) -> str:
    """The address to listen on for peers that connect to ``host``.

    Args:
        host: the name or address peers connect to.
        resolved: the addresses ``host`` resolves to on this machine.
        local: this machine's addresses.
        fallback: where to listen when ``host`` is not surely one address of this machine.

    Returns:
        The one address ``host`` resolves to, when it is this machine's; else ``fallback``.
    """
    addresses = set(resolved)
    if len(addresses) != 1:
        # One socket listens on one address, and peers may use any of them.
        return fallback
    (address,) = addresses
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return fallback
    if ip.is_link_local:
        return fallback  # needs a scope to bind: not worth the trouble
    if ip.is_loopback:
        # An address literal is what the peers use. A name that resolves to loopback here
        # (Debian's 127.0.1.1 for the machine's own name) may resolve to a routable address
        # on the other hosts: listening on loopback would shut them out.
        return address if _is_ip(host.strip("[]")) else fallback
    return address if address in local else fallback


def resolve(host: str) -> list[str]:
    """The TCP addresses ``host`` resolves to here (none if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [
        str(info[4][0])
        for info in infos
        if info[0] in (socket.AF_INET, socket.AF_INET6) and "%" not in str(info[4][0])
    ]


def local_addresses() -> set[str]:
    """The IPv4 and IPv6 addresses of this machine's interfaces."""
    import psutil

    return {
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }


def listen_address(host: str, fallback: str) -> str:
    """Where to listen for peers that connect to ``host`` (see :func:`choose_listen_address`)."""
    return choose_listen_address(host, resolve(host), local_addresses(), fallback)


__all__ = ["choose_listen_address", "listen_address", "local_addresses", "resolve"]
