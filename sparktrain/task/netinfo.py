"""What a task reports of its host's network at rendezvous: interfaces and their addresses,
and where the host's own name resolves to."""

from __future__ import annotations

import ipaddress
import socket


def interface_addresses() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """This host's interfaces that are up, each with its IPv4 addresses, sorted by name.

    Loopback is left out: it never reaches another host. So are interfaces without an IPv4
    address (the ranks' rendezvous speaks IPv4).
    """
    import psutil

    stats = psutil.net_if_stats()
    found = []
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        ipv4 = tuple(
            a.address
            for a in addrs
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback
        )
        if ipv4:
            found.append((name, ipv4))
    return tuple(sorted(found))


def name_address() -> str:
    """The address Gloo binds when it is told no interface: the first address this host's
    name (``gethostname()``) resolves to that a socket can bind; ``""`` when there is none."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ""
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind((sockaddr[0], 0))
        except OSError:
            continue
        return str(sockaddr[0])
    return ""
