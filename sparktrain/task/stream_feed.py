"""A task's side of a run given a DataFrame: its input's Arrow batches go to its ranks.

The stage's input is then the DataFrame's partition (``mapInArrow`` hands the task an iterator
of record batches). While the task's ranks run, a thread hands those batches to them through a
:class:`~sparktrain.data.stream.Feeder`, whose socket each rank finds in its environment
(:data:`~sparktrain.contract.STREAM_ENV`). The ranks' records are the task's outcome: a stream
that fails (a Spark expression that raises, a rank that dies) reaches the ranks reading it, who
fail with its message; the feeder's own error is only logged here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sparktrain import contract

if TYPE_CHECKING:
    from sparktrain.task.assignment import TaskJob

_log = logging.getLogger(__name__)
# The least time ranks get to open their stream: a function may build its model first.
ACCEPT_TIMEOUT = 600.0


def local_dir() -> str | None:
    """Spark's local folder on this executor (never shared storage), where it says."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = dirs.split(",")[0].strip()
    return first if first and os.path.isdir(first) else None


class StreamEnv:
    """What the ranks of one feeder get in their environment to find their stream.

    Args:
        env: the variables every rank gets (none where the run reads no DataFrame).
        slots: the slots the feeder serves, in its local order.
    """

    def __init__(self, env: dict[str, str], slots: Sequence[int]) -> None:
        self.env = env
        self.slots = list(slots)

    def for_slot(self, slot: int) -> dict[str, str]:
        """The variables of the rank in ``slot`` (its index among the feeder's ranks)."""
        if not self.env:
            return {}
        return {**self.env, contract.STREAM_INDEX_ENV: str(self.slots.index(slot))}


NO_STREAM = StreamEnv({}, ())


@contextlib.contextmanager
def feeding(
    job: TaskJob,
    batches: Iterator[Any] | None,
    ranks: Sequence[int],
    input_wait: float | None = None,
) -> Iterator[StreamEnv]:
    """Feed ``batches`` to the ranks of ``ranks`` (their slots, in local order) while inside,
    as ``job`` says (its key, stream window, piece rows and start timeout); yields what each
    rank's environment gets (nothing without ``batches``).

    With several ranks, the input goes out in pieces of at most ``job.stream_rows`` rows
    (slices, not copies), so that dealing them round-robin gives each rank an even share.

    ``input_wait``: how long the way out waits for a thread still inside the input (None: as
    long as it takes, which a Spark task must: its worker may be given the next task, whose
    input is the same stream). The driver's reader may be left in a daemon thread instead,
    so a stopped local run is not held by a partition still being computed.

    On the way out the feeder closes (a rank's stream then ends) and the thread is joined: it
    ends at its next send, after at most one more batch of the input.
    """
    key, window, piece_rows = job.key, job.stream_window, job.stream_rows
    start_timeout = job.run_config.start_timeout
    if batches is None or window <= 0:
        yield NO_STREAM
        return
    from sparktrain.data.stream import Feeder, StreamError

    parent = local_dir()
    names = [f"rank {r}" for r in ranks]
    with Feeder(
        len(ranks),
        key,
        parent=parent,
        window=window,
        accept_timeout=max(ACCEPT_TIMEOUT, start_timeout),
        names=names,
    ) as feeder:

        def feed() -> None:
            try:
                pieces = batches
                if len(ranks) > 1 and piece_rows > 0:
                    pieces = _pieces(batches, piece_rows)
                stats = feeder.feed(pieces)
                _log.debug("stream fed %s rows to %s", stats.rows, names)
            except StreamError as exc:
                _log.info("stream ended early: %s", exc)
            except BaseException as exc:  # noqa: BLE001 - the ranks were told; this is a log
                _log.info("stream failed: %s: %s", type(exc).__name__, exc)

        thread = threading.Thread(target=feed, name="sparktrain-stream", daemon=True)
        thread.start()
        try:
            yield StreamEnv(
                {contract.STREAM_ENV: feeder.address, contract.STREAM_DIR_ENV: parent or ""},
                ranks,
            )
        finally:
            feeder.stop()
            thread.join(input_wait)
            if thread.is_alive():
                _log.info("the stream's input is still computing a piece; left to end alone")


def _pieces(batches: Iterator[Any], rows: int) -> Iterator[Any]:
    """Each batch as zero-copy slices of at most ``rows`` rows."""
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)
