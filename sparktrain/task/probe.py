"""The interface probe: which of the other hosts' interfaces this task really reaches.

Every task listens on one port (all interfaces) from before its hello, and says which in its
TaskInfo. When the ranks span hosts, each task connects to every task on another host at that
task's address on each of its interfaces. The listener answers a random challenge with an HMAC
of the run's key and its own task index, so an address that two hosts share (each host's own
Docker bridge, say) never passes for a link to the other host: a connection that lands on
this host's own interface, or on someone else's port, does not prove the peer. Connects run in
parallel, each bounded by :data:`PROBE_TIMEOUT`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from sparktrain.cluster import ClusterSpec, TaskInfo
from sparktrain.interfaces import with_interface
from sparktrain.task.session import TaskSession
from sparktrain.wire import protocol

# Seconds one probe connection may take (connect, challenge, answer). A link that works
# answers in milliseconds; one that does not costs this once (probes run in parallel).
PROBE_TIMEOUT = 2.0
_CHALLENGE = 16
_ANSWER = 4 + hashlib.sha256().digest_size
_TAG = b"sparktrain-probe:"


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


class ProbeListener:
    """Answers the other tasks' probes until :meth:`close`.

    Args:
        key: the run's key.
        index: this task's index, which the answers prove.
    """

    def __init__(self, key: bytes, index: int) -> None:
        self._key = key
        self._index = index
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("", 0))  # every interface: probing them is the point
        self._sock.listen(64)
        self._port = int(self._sock.getsockname()[1])
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sparktrain-probe", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port peers probe."""
        return self._port

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with conn:
                try:
                    conn.settimeout(PROBE_TIMEOUT)
                    challenge = _read(conn, _CHALLENGE)
                    if len(challenge) == _CHALLENGE:
                        conn.sendall(_answer(self._key, challenge, self._index))
                except OSError:
                    continue

    def close(self) -> None:
        """Stop answering and free the port (again: nothing)."""
        self._closed.set()
        try:
            # Wakes the accept loop at once (on Linux), rather than at its next timeout.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected, or closed already
        self._sock.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def __enter__(self) -> ProbeListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reaches(address: str, port: int, index: int, key: bytes, timeout: float) -> bool:
    """Whether the task ``index`` answers at ``address:port`` (proven by the run's key)."""
    challenge = os.urandom(_CHALLENGE)
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(challenge)
            answer = _read(sock, _ANSWER)
    except OSError:
        return False
    return hmac.compare_digest(answer, _answer(key, challenge, index))


def probe(
    me: TaskInfo, tasks: Sequence[TaskInfo], key: bytes, timeout: float = PROBE_TIMEOUT
) -> dict[str, list[int]]:
    """Probe every task on another host at each of its interfaces.

    Returns:
        Interface name -> indices of the tasks that answered at their address on it.
    """
    targets = [
        (name, peer, addrs[0])
        for peer in tasks
        if peer.host != me.host and peer.probe_port
        for name, addrs in peer.interfaces
        if addrs
    ]
    reached: dict[str, list[int]] = {}
    if not targets:
        return reached
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        # A task of several slots answers for its first one (each slot is probed alike).
        results = pool.map(
            lambda t: reaches(t[2], t[1].probe_port, t[1].first_index, key, timeout), targets
        )
        for (name, peer, _), ok in zip(targets, results, strict=True):
            if ok:
                reached.setdefault(name, []).append(peer.index)
    return reached


def settle_interface(
    session: TaskSession,
    spec: ClusterSpec,
    me: TaskInfo,
    nics: Sequence[str] | None,
    slots: Sequence[int] = (),
) -> ClusterSpec | None:
    """``spec`` on the interface every rank talks over.

    On one host every interface of the host joins its ranks, so nothing is probed: ``nics``
    picks the first of its interfaces the host has, else the executor's own one stays. Across
    hosts this task probes the others, tells the driver what it reached, and takes the driver's
    choice (made with :func:`sparktrain.interfaces.choose_interface` once every task has
    probed; no interface reaching every host ends the run there with an error).

    Args:
        session: this task's session.
        spec: the layout, every task's interfaces in it.
        me: this task (its first slot, when it runs several ranks).
        nics: the run's ``nics`` setting.
        slots: the indices this task speaks for (default: ``me`` alone).

    Returns:
        The spec with the interface set, or None when the run was stopped first.
    """
    if spec.num_nodes < 2 or not all(r.task.probe_port for r in spec.ranks):
        name = next((n for n in nics or () if me.addresses_of(n)), None)
        return with_interface(spec, name) if name else spec
    tasks = [r.task for r in spec.ranks]
    reached = probe(me, tasks, session.job.key)
    for index in slots or (me.index,):  # the driver counts every slot's word
        session.send(protocol.PROBED(index=index, reached=reached))
    chosen = session.wait_for_interface()
    return None if chosen is None else with_interface(spec, chosen)
