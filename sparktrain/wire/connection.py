"""One connection of a :class:`~sparktrain.wire.server.FrameServer`: what it has read, what
waits to be sent to it, and the process's file limit that bounds how many there may be."""

from __future__ import annotations

import collections
import logging
import os
import resource
import socket
import threading
import time

from sparktrain.errors import ConfigurationError
from sparktrain.wire.frames import MAX_FRAME, NONCE_BYTES

# Most bytes queued for one peer that does not read: a few of the largest frames.
MAX_OUTBOX = 4 * MAX_FRAME
# Descriptors the process keeps for everything but the server's connections (files, pipes,
# Spark's own sockets, the ranks' pipes on a local run).
FD_RESERVE = 256

_log = logging.getLogger("sparktrain.wire")


def ensure_fd_limit(needed: int, required: int | None = None) -> int:
    """Make sure this process may hold ``needed`` more descriptors than it has reserved.

    Raises the soft ``RLIMIT_NOFILE`` toward the hard limit when it is too low.

    Args:
        needed: connections the server may hold at most.
        required: connections it cannot do without (default: ``needed``); between the two,
            a hard limit too low for ``needed`` is only warned about.

    Returns:
        The soft limit now in force.

    Raises:
        ConfigurationError: the hard limit is too low for ``required`` (it names both limits
            and the fix).
    """
    want = needed + FD_RESERVE
    least = (needed if required is None else required) + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return int(soft)
    fix = f"raise it (ulimit -n {want}, or LimitNOFILE / nofile in limits.conf)"
    if hard != resource.RLIM_INFINITY and hard < least:
        raise ConfigurationError(
            f"this run needs at least {least} open files on the driver ({least - FD_RESERVE} "
            f"connections), but the process may open at most {hard} (RLIMIT_NOFILE hard limit, "
            f"soft {soft}): {fix} or use fewer ranks"
        )
    if hard != resource.RLIM_INFINITY and hard < want:
        _log.warning(
            "the process may open at most %d files (RLIMIT_NOFILE hard limit); %d connections "
            "may need %d: %s",
            hard,
            needed,
            want,
            fix,
        )
        want = int(hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


class Connection:
    """One peer's socket (non-blocking) and its state; sending is thread-safe."""

    def __init__(self, conn_id: int, sock: socket.socket) -> None:
        self.id = conn_id
        self.sock = sock
        self.nonce = os.urandom(NONCE_BYTES)
        self.opened = time.monotonic()
        self.authenticated = False
        self.closed = False
        self.paused = False
        self.recv_seq = 0
        self.buf = bytearray()
        # When the frame now arriving must be whole (None: between frames).
        self.frame_deadline: float | None = None
        # Sending (any thread, under lock): the next sequence number and what waits.
        self.lock = threading.Lock()
        self.send_seq = 0
        self.out: collections.deque[memoryview] = collections.deque()
        self.out_bytes = 0
        self.out_since = 0.0  # when the queue last moved
        self.events = 0  # what the selector watches for

    def queue(self, frame: memoryview) -> bool | None:
        """Send ``frame`` now as far as the socket takes it, queueing the rest (under
        :attr:`lock`).

        Returns:
            True if all of it went, False if some waits (the selector must watch for
            writing), None if the connection failed or is too far behind (over
            :data:`MAX_OUTBOX`).
        """
        if self.out_bytes + len(frame) > MAX_OUTBOX:
            return None
        if not self.out:
            try:
                frame = frame[self.sock.send(frame) :]
            except BlockingIOError:
                pass
            except OSError:
                return None
            if not frame:
                return True
            self.out_since = time.monotonic()
        self.out.append(frame)
        self.out_bytes += len(frame)
        return False

    def flush(self) -> None:
        """Send what waits, as far as the socket takes it."""
        with self.lock:
            while self.out:
                head = self.out[0]
                try:
                    sent = self.sock.send(head)
                except BlockingIOError:
                    break
                except OSError:
                    self.out.clear()
                    break
                self.out_since = time.monotonic()
                self.out_bytes -= sent
                if sent == len(head):
                    self.out.popleft()
                else:
                    self.out[0] = head[sent:]
