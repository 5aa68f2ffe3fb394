"""A rank's result (rank 0's, or every rank's for ``run_all``), from its Spark task to the
driver over the run's channel.

A Spark task's return value is held whole by the executor's JVM, serialized there, and held
again by the driver under ``spark.driver.maxResultSize``: a result of a few hundred MiB kills
an executor with OutOfMemoryError. So the result goes to the driver in pieces over the
channel, and the task's record only says that it did. A task sends its ranks' results one at
a time, also when the run is being stopped (another rank failed): the driver collects the
results already on their way while it waits for the tasks to end, and keeps them when the run
fails. If the driver does not confirm that it holds the result (it was cut short, or all
ranks' results together would pass ``max_result_bytes``), the task keeps it in a file on its
host and the record names that file: a trained result is never lost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterable, Iterator

from sparktrain import wire
from sparktrain.errors import WorkerFailure
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.shipping.payload import keep_and_say, kept_result_name
from sparktrain.task.driver_link import TaskSession
from sparktrain.wire import protocol

# Bytes per message: a frame holds 1 MiB, with room to spare for the message's JSON.
CHUNK = 1 << 19
# The driver's confirmation may take this long, plus a second for every 16 MiB.
CONFIRM_TIMEOUT = 60.0
# ... and while the run is being stopped (the driver then collects the results already on
# their way while it waits, a few seconds, for the tasks to confirm their end).
STOP_CONFIRM_TIMEOUT = 10.0
# Why the driver did not hold a result sent while it stopped the run.
STOPPING = "the run was being stopped when it finished"


def deliver(
    session: TaskSession, records: Iterable[RankOutcome], host: str
) -> Iterator[RankOutcome]:
    """The records, with each result sent to the driver instead of carried.

    Args:
        session: the task's link to the driver.
        records: its ranks' records.
        host: this task's host, for the error that names a kept result.
    """
    if session.client is None:
        # No channel (a detached run under Spark Connect): the records carry the result.
        yield from records
        return
    for record in records:
        data = record.result
        if data is None:
            yield record
        elif (error := _send(session, record.index, data)) is None:
            yield dataclasses.replace(record, result=None, result_sent=len(data))
        else:
            # A stop (a timeout, a failed rank, Ctrl-C) that came before the driver confirmed
            # it is no failure of the rank.
            stopped = session.aborted.is_set()
            yield _kept(session, record, data, host, STOPPING if stopped else error, stopped)


def _send(session: TaskSession, index: int, data: bytes | bytearray) -> str | None:
    """Send ``data`` to the driver; None once it confirmed that it holds it, else why not."""
    client = session.client
    assert client is not None  # deliver() sends only over a channel
    view = memoryview(data)
    try:
        for offset in range(0, len(data), CHUNK):
            piece = view[offset : offset + CHUNK]
            client.send(protocol.RESULT_CHUNK(index=index, offset=offset, blob=piece))
        digest = hashlib.sha256(data).hexdigest()
        client.send(protocol.RESULT_END(index=index, size=len(data), sha256=digest))
    except (OSError, wire.FrameError) as exc:
        return f"sending it failed ({exc})"
    # While the run is stopped the driver still answers, as long as it waits for the tasks to
    # confirm their end; past that it answers no more, and the task must not outwait it.
    patience = STOP_CONFIRM_TIMEOUT if session.aborted.is_set() else CONFIRM_TIMEOUT
    return session.result_saved(patience + len(data) / (16 << 20))


def _kept(
    session: TaskSession,
    record: RankOutcome,
    data: bytes | bytearray,
    host: str,
    why: str,
    stopped: bool = False,
) -> RankOutcome:
    """The record of a result the driver did not get, kept on this host if possible: failed,
    or ``stopped`` when the driver was stopping the run."""
    job = session.job
    size = f"{len(data) / (1 << 20):.1f} MiB" if len(data) >= 100 << 10 else f"{len(data)} bytes"
    rank = record.rank
    where = keep_and_say(data, kept_result_name(job.run_id, job.attempt, rank), host)
    failure = WorkerFailure(
        rank=rank,
        host=host,
        exit_code=0,
        phase="stopped" if stopped else "result",
        time=time.time(),
        message=f"rank {rank} finished, but its result ({size}) did not reach the driver: {why}; "
        + where,
    )
    status = RankStatus.STOPPED if stopped else RankStatus.FAILED
    # Also over the channel, as a rank's own end is: a job cancelled meanwhile (the driver
    # stops the run when a rank fails) may never return its records.
    if stopped:
        session.send(protocol.STACK(record=failure.to_json(), stopped=True))
    else:
        session.send(protocol.FAILURE(failure=failure.to_json()))
    return dataclasses.replace(record, status=status, result=None, failure=failure)
