"""The interface probe: which of the other hosts' interfaces this host really reaches.

Every task listens on one port from before its hello (on its interfaces' addresses, where it
knows them), and says which in its TaskInfo. When the ranks span hosts, one task per host
(its prober, see :mod:`sparktrain.layout.rendezvous`) connects to the prober of each host it is
given, at that task's address on each of its interfaces. The listener answers a random
challenge with an HMAC of the run's key and its own task index, so an address that two hosts
share (each host's own Docker bridge, say) never passes for a link to the other host: a
connection that lands on this host's own interface, or on someone else's port, does not
prove the peer. Probes run in parallel, each bounded by :data:`PROBE_TIMEOUT`.

The listener is one thread with a selector, whatever connects to it: each connection has
:data:`CONNECTION_DEADLINE` from its accept to send its challenge, at most
:data:`MAX_PENDING` wait at once (the oldest is dropped for a new one), so connections that
never send (or send slowly) cannot hold the port against a real probe; a probe that lost its
connection anyway is tried again while the start budget lasts.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import hashlib
import hmac
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from sparktrain.layout.cluster import ClusterSpec, TaskInfo
from sparktrain.layout.interfaces import with_interface
from sparktrain.layout.rendezvous import TaskView
from sparktrain.task.driver_link import TaskSession
from sparktrain.wire import protocol

# Seconds one link is tried for (connect, challenge, answer, again if it fails). A link that
# works answers in milliseconds; one that does not costs this once (links run in parallel).
PROBE_TIMEOUT = 2.0
# Each try within it gets at most this part of it: a connection that got no answer (its
# handshake lost to a listener whose queue strangers filled, say) is made again at once,
# rather than waiting on the kernel's slower retransmits.
TRY_SHARE = 0.25
# A link whose connections are dropped (by a crowded listener) is tried for up to this many
# such windows, while the start budget lasts; a silent one gets one window.
PROBE_TRIES = 3
# Seconds a connection to the listener has, from its accept, to send its challenge; a real
# probe sends it at once.
CONNECTION_DEADLINE = 1.0
# Connections the listener holds at once, waiting for their challenge; the oldest goes first.
MAX_PENDING = 256
# Connections the kernel queues for the listener before it accepts them.
BACKLOG = 1024
# Probes in flight at once for one prober.
MAX_PARALLEL = 128
# Pause before trying again a link whose connection was dropped.
_RETRY_PAUSE = 0.05
_CHALLENGE = 16
_ANSWER = 4 + hashlib.sha256().digest_size
_TAG = b"sparktrain-probe:"
_BIND_TRIES = 8


def _answer(key: bytes, challenge: bytes, index: int) -> bytes:
    who = struct.pack("!I", index)
    return who + hmac.new(key, _TAG + challenge + who, hashlib.sha256).digest()


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _bind(addresses: Sequence[str]) -> list[socket.socket]:
    """Listening sockets on one port, one per address; every interface when ``addresses`` is
    empty, or when no port is free on all of them."""
    for _ in range(_BIND_TRIES if addresses else 0):
        socks: list[socket.socket] = []
        port = 0
        try:
            for address in addresses:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((address, port))
                port = int(sock.getsockname()[1])
            return socks
        except OSError:
            for sock in socks:
                sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    return [sock]


class ProbeListener:
    """Answers the other tasks' probes until :meth:`close` (one thread; see the module).

    Args:
        key: the run's key.
        index: this task's index, which the answers prove.
        addresses: where to listen (this task's interfaces' addresses: what is probed);
            every interface when empty.
        deadline: seconds a connection has from its accept to send its challenge.
        max_pending: connections held at once; the oldest is dropped for a new one.
    """

    def __init__(
        self,
        key: bytes,
        index: int,
        addresses: Sequence[str] = (),
        deadline: float = CONNECTION_DEADLINE,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._key = key
        self._index = index
        self._deadline = deadline
        self._max_pending = max_pending
        self._socks = _bind(list(dict.fromkeys(addresses)))
        self._port = int(self._socks[0].getsockname()[1])
        self._selector = selectors.DefaultSelector()
        for sock in self._socks:
            sock.listen(BACKLOG)
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, "listen")
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        # Connections waiting for their challenge, oldest first: deadline and what came.
        self._pending: collections.OrderedDict[socket.socket, tuple[float, bytearray]] = (
            collections.OrderedDict()
        )
        # Connections dropped before they sent a challenge (expired or pushed out).
        self.dropped = 0
        self.answered = 0
        self._thread = threading.Thread(target=self._serve, name="sparktrain-probe", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port peers probe."""
        return self._port

    @property
    def addresses(self) -> list[str]:
        """The addresses listened on (``0.0.0.0``: every interface)."""
        return [str(sock.getsockname()[0]) for sock in self._socks]

    def _drop(self, conn: socket.socket, counted: bool = True) -> None:
        # Counted before the close, so that a peer who sees its connection closed finds it
        # counted too.
        self.dropped += counted
        self._pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        conn.close()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed, or out of descriptors: the next round tries again
            conn.setblocking(False)
            self._pending[conn] = (time.monotonic() + self._deadline, bytearray())
            self._selector.register(conn, selectors.EVENT_READ, "conn")
            while len(self._pending) > self._max_pending:
                self._drop(next(iter(self._pending)))

    def _receive(self, conn: socket.socket) -> None:
        entry = self._pending.get(conn)
        if entry is None:
            return
        got = entry[1]
        try:
            chunk = conn.recv(_CHALLENGE - len(got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        got += chunk
        if len(got) < _CHALLENGE:
            return
        # Counted before it is sent (as drops are before the close): the peer that reads it
        # finds it counted.
        self.answered += 1
        try:
            # A fresh connection's send buffer takes the few bytes at once.
            conn.send(_answer(self._key, bytes(got), self._index))
        except OSError:
            self.answered -= 1
        self._drop(conn, counted=False)

    def _expire(self) -> float | None:
        """Drop the connections past their deadline; seconds to the next one's."""
        now = time.monotonic()
        while self._pending:
            conn, (deadline, _) = next(iter(self._pending.items()))
            if deadline > now:
                return deadline - now
            self._drop(conn)
        return None

    def _serve(self) -> None:
        try:
            while True:
                for key, _ in self._selector.select(self._expire()):
                    if key.data == "wake":
                        return
                    sock = cast(socket.socket, key.fileobj)
                    if key.data == "listen":
                        self._accept(sock)
                    else:
                        self._receive(sock)
        except (OSError, ValueError):
            return  # closed under us
        finally:
            for conn in list(self._pending):
                self._drop(conn, counted=False)

    def close(self) -> None:
        """Stop answering and free the port (again: nothing)."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        for sock in (*self._socks, self._wake_r, self._wake_w):
            sock.close()
        with contextlib.suppress(Exception):
            self._selector.close()

    def __enter__(self) -> ProbeListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _try(address: str, port: int, index: int, key: bytes, timeout: float) -> str:
    """One probe: ``"ok"``; ``"other"`` when another task answered, or nothing listens
    there (refused: the task listens from before its hello, so the address leads elsewhere,
    as a shared one does; a full queue drops a connection, it does not refuse it);
    ``"silent"`` when it took the whole ``timeout``; ``"lost"`` when the connection was
    made and then dropped (a crowded listener)."""
    challenge = os.urandom(_CHALLENGE)
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(challenge)
            answer = _read(sock, _ANSWER)
    except TimeoutError:
        return "silent"
    except ConnectionRefusedError:
        return "other"
    except OSError as exc:
        # No route, or the network is down: as dead as a silent link.
        return "silent" if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else "lost"
    if len(answer) < _ANSWER:
        return "lost"
    return "ok" if hmac.compare_digest(answer, _answer(key, challenge, index)) else "other"


def _link(
    address: str,
    port: int,
    index: int,
    key: bytes,
    timeout: float,
    end: float | None,
    tries: int,
) -> bool:
    """Whether task ``index`` answers at ``address:port``, tried for ``timeout`` (so a dead
    link costs that once), and for up to ``tries`` such windows before ``end`` while each
    try is dropped at once (a crowded listener)."""
    window_end = time.monotonic() + timeout
    windows = 1
    while True:
        left = window_end - time.monotonic()
        outcome = _try(address, port, index, key, max(0.01, min(timeout * TRY_SHARE, left)))
        if outcome in ("ok", "other"):
            return outcome == "ok"
        now = time.monotonic()
        if outcome == "lost" and now >= window_end and windows < tries:
            if end is None or now + timeout <= end:
                windows += 1
                window_end = now + timeout
        if now >= window_end:
            return False
        if outcome == "lost":
            time.sleep(min(_RETRY_PAUSE, window_end - now))  # let a crowded listener drain


def reaches(address: str, port: int, index: int, key: bytes, timeout: float) -> bool:
    """Whether the task ``index`` answers at ``address:port`` (proven by the run's key), in
    one try."""
    return _try(address, port, index, key, timeout) == "ok"


@dataclasses.dataclass(frozen=True)
class _Link:
    name: str
    peer: TaskInfo
    address: str


def probe(
    targets: Sequence[TaskInfo],
    key: bytes,
    timeout: float = PROBE_TIMEOUT,
    budget: float | None = None,
    tries: int = PROBE_TRIES,
) -> dict[str, list[int]]:
    """Probe each of ``targets`` at its address on each of its interfaces.

    Every link is tried at once (up to :data:`MAX_PARALLEL`), each for ``timeout``, again
    and again within it while it fails; a link dropped at once each time is tried for up to
    ``tries`` such windows while ``budget`` lasts; a silent one costs ``timeout`` once.

    Args:
        targets: the tasks to probe (other hosts' probers), each answering for its index.
        key: the run's key.
        timeout: seconds one link is tried for.
        budget: seconds all windows may take (None: no bound beyond ``tries``).
        tries: windows of a link that is dropped at once.

    Returns:
        Interface name -> indices of the targets that answered at their address on it.
    """
    links = [
        _Link(name, peer, addrs[0])
        for peer in targets
        if peer.probe_port
        for name, addrs in peer.interfaces
        if addrs
    ]
    reached: dict[str, list[int]] = {}
    end = None if budget is None else time.monotonic() + budget

    def one(link: _Link) -> bool:
        peer = link.peer
        return _link(link.address, peer.probe_port, peer.first_index, key, timeout, end, tries)

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(links)))) as pool:
        for link, ok in zip(links, pool.map(one, links), strict=True):
            if ok:
                reached.setdefault(link.name, []).append(link.peer.index)
    return {name: sorted(found) for name, found in reached.items()}


def settle_interface(session: TaskSession, view: TaskView, me: TaskInfo) -> ClusterSpec | None:
    """This task's view of the layout on the interface every rank talks over.

    On one host every interface of the host joins its ranks, so nothing is probed: ``nics``
    picks the first of its interfaces the host has, else the executor's own one stays. Across
    hosts each host's prober probes the hosts it is given and tells the driver what it
    reached; every task takes the driver's choice (made with
    :func:`sparktrain.layout.interfaces.choose_interface` once every prober has said; no interface
    reaching every host ends the run there with an error).

    Args:
        session: this task's session.
        view: this task's part of the layout (:func:`sparktrain.layout.rendezvous.view_of`).
        me: this task (its first slot, when it runs several ranks).

    Returns:
        The view's spec with the interface set, or None when the run was stopped first.
    """
    nics = session.config.nics
    if not view.probing:
        name = next((n for n in nics or () if me.addresses_of(n)), None)
        return with_interface(view.spec, name) if name else view.spec
    if view.probe:
        # Half the start budget: what is left covers the driver's choice and the ranks' start.
        budget = session.config.start_timeout / 2
        reached = probe(view.probe, session.job.key, budget=budget)
        session.send(protocol.PROBED(index=me.first_index, reached=reached))
    chosen = session.wait_for_interface()
    return None if chosen is None else with_interface(view.spec, chosen)
