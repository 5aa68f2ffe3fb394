"""Rank side: this rank's share of its task's stream, as batches of tensors, epoch after epoch.

The first epoch comes off the task's socket as the task reads its partition, and is written to
a :class:`~sparktrain.data.stream.spill.Spill` as it goes; every later epoch reads the spill.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from sparktrain import contract
from sparktrain.data.stream import protocol, rows
from sparktrain.data.stream.protocol import StreamError
from sparktrain.data.stream.spill import Spill
from sparktrain.errors import ConfigurationError

Batch = dict[str, Any]


class RankStream:
    """A context manager over one rank's stream; each ``iter()`` of it is one epoch.

    Example::

        with RankStream(address, local_index, batch_size=256, shuffle_buffer=10_000,
                        seed=7) as loader:
            for epoch in range(3):
                for batch in loader:          # epoch 0 streams, epochs 1, 2 read the spill
                    step(batch["features"], batch["label"])

    Args:
        address: the task's socket (:attr:`Feeder.address`).
        index: this rank's local index in its task (``LOCAL_RANK`` within the task).
        batch_size: rows per batch (the stream's batches are re-cut to it).
        key: the run's key; default from the environment the launcher sets.
        shuffle_buffer: rows held for the within-partition shuffle; 0 keeps the order.
        seed: the shuffle's seed; each epoch's order is drawn from ``(seed, epoch)``.
        drop_last: leave out each epoch's last batch when it is short.
        columns: the columns to serve (default all).
        transform: called on each batch dict; its result is what the loop gets.
        local_dir: where to spill the first epoch (Spark's local dir on an executor).
        spill: whether to spill; without it only one epoch can be read.
        connect_timeout: seconds to wait for the feeder to answer.
    """

    def __init__(
        self,
        address: str,
        index: int,
        batch_size: int,
        key: bytes | None = None,
        shuffle_buffer: int = 0,
        seed: int | None = None,
        drop_last: bool = False,
        columns: Sequence[str] | None = None,
        transform: Callable[[Batch], Any] | None = None,
        local_dir: str | Path | None = None,
        spill: bool = True,
        connect_timeout: float = 60.0,
    ) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, not {batch_size}")
        if shuffle_buffer < 0:
            raise ConfigurationError(f"shuffle_buffer must be >= 0, not {shuffle_buffer}")
        self.address = address
        self.index = index
        self.batch_size = batch_size
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(8), "big") >> 1
        self.drop_last = drop_last
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self._key = key if key is not None else _key_from_env()
        self._local_dir = local_dir
        self._want_spill = spill
        self._timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._spill: Spill | None = None
        self._streamed = False  # the socket was read to its end
        self._schema: pa.Schema | None = None  # the last schema frame's (kept across a drain)
        self.epoch = 0

    def __enter__(self) -> RankStream:
        try:
            if self._want_spill:
                self._spill = Spill(self._local_dir)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock = sock
            sock.settimeout(self._timeout)
            with protocol.reachable(self.address) as name:
                sock.connect(name)
            protocol.greet_feeder(sock, self._key, self.index)
            sock.settimeout(None)
        except (OSError, EOFError) as exc:
            self.close()
            raise StreamError(
                f"local rank {self.index} could not open its task's stream at {self.address}: {exc}"
            ) from exc
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and remove the spill (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def __iter__(self) -> Iterator[Any]:
        """The next epoch's batches."""
        epoch = self.epoch
        self.epoch += 1
        if epoch == 0:
            source: Iterator[pa.RecordBatch] = self._stream()
        else:
            self._drain()
            if self._spill is None:
                raise StreamError(
                    "epoch 2 and later read the first epoch's spill; open the loader with "
                    "spill=True to read more than one epoch"
                )
            source = self._spill.batches()
        rng = np.random.default_rng([self.seed, epoch])
        kinds: dict[str, rows.ColumnKind] | None = None
        shuffled = rows.shuffled(source, self.shuffle_buffer, rng)
        for table in rows.cut(shuffled, self.batch_size, self.drop_last):
            if kinds is None:
                kinds = rows.plan(table.schema, self.columns)
            batch = rows.to_tensors(table, kinds)
            yield self.transform(batch) if self.transform is not None else batch

    def batches_ahead(self) -> int | None:
        """How many batches the next ``iter()`` gives, where that is known before it starts:
        from the second epoch on, its rows are the finished spill's (what was left of the
        stream is read into it first). None for the first epoch, whose rows arrive as the
        task reads its partition."""
        if self.epoch == 0 or self._spill is None:
            return None
        self._drain()
        whole, rest = divmod(self._spill.rows, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def _drain(self) -> None:
        """Read what is left of the stream into the spill (an epoch 0 left early)."""
        if not self._streamed:
            for _ in self._stream():
                pass

    def _stream(self) -> Iterator[pa.RecordBatch]:
        sock = self._sock
        if sock is None:
            raise StreamError("the stream is not open: use the loader in a with block")
        while True:
            try:
                kind, payload = protocol.recv_frame(sock)
            except (EOFError, OSError) as exc:
                raise StreamError(
                    f"local rank {self.index}'s stream ended before its end ({exc}): the task "
                    f"feeding it failed or was cancelled"
                ) from exc
            if kind == protocol.FAIL:
                raise StreamError(payload.decode("utf-8", "replace"))
            if kind == protocol.END:
                self._streamed = True
                if self._spill is not None:
                    self._spill.finish()
                return
            buffer = pa.py_buffer(payload)
            if kind == protocol.SCHEMA:
                self._schema = pa.ipc.read_schema(buffer)
                continue
            if self._schema is None:
                raise StreamError("the stream sent a batch before its schema")
            batch = pa.ipc.read_record_batch(buffer, self._schema)
            with contextlib.suppress(OSError):  # a gone feeder shows at the next read
                sock.sendall(protocol.CREDIT)
            if self._spill is not None:
                self._spill.write(batch)
            yield batch


def _key_from_env() -> bytes:
    value = os.environ.get(contract.KEY_ENV)
    if not value:
        raise ConfigurationError(
            f"the stream needs the run's key, which sparktrain's launcher puts in "
            f"{contract.KEY_ENV}; pass key= where the loader runs outside a sparktrain rank"
        )
    return bytes.fromhex(value)
