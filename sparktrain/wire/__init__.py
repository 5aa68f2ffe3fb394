"""The run's wire: authenticated frames, the one server that speaks them, and the messages.

* :mod:`~sparktrain.wire.frames` — the frame format and the client side of a connection;
* :mod:`~sparktrain.wire.server` — :class:`FrameServer`, used by the driver's channel and by
  an MPI task's peer server;
* :mod:`~sparktrain.wire.protocol` — every message kind and the fields it must carry;
* :mod:`~sparktrain.wire.address` — where a server listens: the one address its peers use.

Driver, task and worker all import this package, so it imports nothing of theirs.
"""

from sparktrain.wire.frames import (
    MAC_BYTES,
    MAGIC,
    MAX_FRAME,
    NONCE_BYTES,
    REFUSED,
    TO_CLIENT,
    TO_SERVER,
    ChannelClient,
    FrameError,
    NotReached,
    encode,
    encode_body,
    new_key,
    parse_address,
    read_frame,
    recv_exact,
)
from sparktrain.wire.server import FrameServer

__all__ = [
    "MAC_BYTES",
    "MAGIC",
    "MAX_FRAME",
    "NONCE_BYTES",
    "REFUSED",
    "TO_CLIENT",
    "TO_SERVER",
    "ChannelClient",
    "FrameError",
    "NotReached",
    "FrameServer",
    "encode",
    "encode_body",
    "new_key",
    "parse_address",
    "read_frame",
    "recv_exact",
]
