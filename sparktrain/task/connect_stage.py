"""The task side of a run launched from a Spark Connect session.

Connect has no RDD API: the barrier stage is ``DataFrame.mapInArrow(..., barrier=True)`` and
each task's records come back as rows of one binary column. When the executors can reach the
client, a task is the same as a classic one (:func:`~sparktrain.task.entry.run_spark_task`).
When they cannot (a laptop, a remote notebook), the task runs *detached*: the layout comes from
Spark's own ``allGather``, what rank 0's task prepares travels the same way, and a failed rank's
record (root cause, traceback, output tail) is raised out of the task, which ends the barrier
stage (Spark does not retry a failed barrier result stage) and reaches the client inside the
job's error. Live output goes to ``log_dir`` when one is set.

A session's first stage also checks what a separate job used to check before it: each task
compares its Python and package versions with the client's, and (attached) gives the
client's channel :data:`REACH_TIMEOUT` to answer. Either failure ends the stage with what the
task found inside the job's error, before any rank starts; the client then refuses the run
with what to change, or runs it again detached.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

from sparktrain.errors import root_cause_order
from sparktrain.layout.cluster import TaskInfo
from sparktrain.layout.rendezvous import go_for
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.task.assignment import TaskJob
from sparktrain.task.driver_link import TaskSession
from sparktrain.wire import protocol

RECORD_COLUMN = "record"
# Around a detached task's failure record inside the text of the job's error.
FAILURE_MARK = "SPARKTRAIN-FAILURE["
FAILURE_END = "]SPARKTRAIN-FAILURE"
# Around what a first stage's task found (versions that differ, a client not reached).
CHECK_MARK = "SPARKTRAIN-CHECK["
CHECK_END = "]SPARKTRAIN-CHECK"
# How long a first stage's task tries to connect to the client before the run goes detached.
REACH_TIMEOUT = 5.0
# What the client compares with the executors before a run: the pickles of the function and
# its result cross between the two, so these must agree.
PACKAGES = ("cloudpickle", "torch", "sparktrain")
# Beyond the grace period, how long a failure that only followed a peer's loss waits for the
# peer's own failure to end the stage.
PEER_FAILURE_WAIT = 10.0


def record_schema() -> Any:
    """The stage's output schema, one binary column of records: a ``StructType``, which the
    client sends as it is (a DDL string would cost a round trip for the server to parse)."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField(RECORD_COLUMN, BinaryType())])


class DetachedSession(TaskSession):
    """A task's session when the client cannot be reached: Spark's barrier carries the layout.

    Args:
        job: what the task was handed (its ``channel`` is empty).
        context: the task's ``BarrierTaskContext``.
    """

    def __init__(self, job: TaskJob, context: Any) -> None:
        super().__init__(job, None)
        self.context = context
        # What this task said of its slots (one per rank it runs).
        self._infos: list[dict[str, Any]] = []
        # The pipe this task's zygotes hold: its read end is theirs (closed here once they
        # have it), its write end is closed by output_out.
        self._theirs: int | None = None
        self._gate: int | None = None

    def _hold(self) -> int | None:
        """A pipe's read end: with no connection to the client, the zygotes wait for the
        task's output to be out instead (:meth:`output_out` closes the other end)."""
        self._theirs, self._gate = os.pipe()
        return self._theirs

    def _release(self, held: bool) -> None:
        theirs, self._theirs = self._theirs, None
        if theirs is not None:
            os.close(theirs)

    def output_out(self) -> None:
        """The task's output has been handed to Spark: its zygotes may load. Idempotent."""
        gate, self._gate = self._gate, None
        if gate is not None:
            os.close(gate)

    def send(self, message: dict[str, Any]) -> None:
        """Keep this task's own hellos (the one message the layout needs); drop the rest."""
        if message.get("type") == protocol.HELLO.name:
            self._infos.append(message["info"])

    def listen(self) -> None:
        """Nothing to listen to: a cancelled job kills this task, and its ranks with it."""

    def wait_for_go(self) -> dict[str, Any] | None:
        """This task's ``go``, computed here from every task's info (Spark's ``allGather``).

        Nothing is probed: there is no driver to choose the interface, so the executors'
        own one (or the first of ``nics`` a host has) stays.
        """
        gathered = self.context.allGather(json.dumps(self._infos))
        tasks = [TaskInfo.from_json(info) for text in gathered for info in json.loads(text)]
        slots = [int(info["index"]) for info in self._infos]
        config = self.config
        return go_for(tasks, slots, False, config.launcher, config.node, config.use_gpu)

    def others_ended(self, wait: float) -> bool:
        """Whether every task of the run got here (its ranks ended, failed or not) within
        ``wait`` seconds: a failed task waits for its peers' ranks to end, so that when its
        error reaches the client none of them is still running. Spark's ``allGather`` cannot
        be interrupted, so it runs in a thread that a stage's end releases."""
        arrived = threading.Event()

        def gather() -> None:
            try:
                self.context.allGather("ended")
            except Exception:  # noqa: BLE001 - a stage that ended releases it with an error
                return
            arrived.set()

        threading.Thread(target=gather, name="sparktrain-ranks-ended", daemon=True).start()
        return arrived.wait(wait)

    def exchange(self, values: dict[str, str] | None) -> dict[str, str] | None:
        """Rank 0's task's values, handed to every task through ``allGather``."""
        gathered = self.context.allGather(json.dumps(values))
        found = [json.loads(text) for text in gathered]
        return next((v for v in found if v is not None), None)


def run_connect_task(job: TaskJob, batches: Iterator[Any]) -> Iterator[Any]:
    """Body of one barrier task of ``mapInArrow``: yields its records as Arrow batches.

    Raises:
        RuntimeError: in a detached run, when a rank failed; its message carries the record.
            In a session's first stage (``job.client_versions``), when this executor's
            versions differ from the client's or the client's channel cannot be reached: its
            message carries what the client needs to say so (:func:`check_in`).
    """
    import pyarrow as pa

    from sparktrain.task.entry import run_spark_task

    if not job.stream_window:
        for _ in batches:
            pass  # the input only sets the number of tasks
        batches = iter(())
    if job.client_versions is not None:
        different = mismatches(job.client_versions, versions())
        if different:
            _raise_check({"versions": different})
    # Detached, the zygotes of this task's cold ranks load once its output is out (attached,
    # once the client has it: see TaskSession.finish).
    detached = None if job.channel else DetachedSession(job, _barrier_context())
    try:
        if detached is not None:
            records = _run_detached(job, detached, batches)
        elif job.client_versions is None:
            records = list(run_spark_task(job, batches))
        else:
            records = _run_reached(job, batches)
        rows = [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in records]
        yield pa.RecordBatch.from_pydict({RECORD_COLUMN: pa.array(rows, type=pa.binary())})
    finally:
        if detached is not None:
            detached.output_out()


def _barrier_context() -> Any:
    from pyspark import BarrierTaskContext

    return BarrierTaskContext.get()


def _run_reached(job: TaskJob, batches: Iterator[Any]) -> list[dict[str, Any]]:
    """A first stage's task: one that cannot connect to the client's channel within
    :data:`REACH_TIMEOUT` ends the stage saying why, so that the run goes detached."""
    from sparktrain import wire
    from sparktrain.task.entry import run_spark_task

    timeout = job.run_config.start_timeout
    try:
        client = wire.ChannelClient(job.channel, job.key, timeout=timeout, reach=REACH_TIMEOUT)
    except wire.NotReached as exc:
        _raise_check({"unreached": str(exc)})
    except ConnectionRefusedError as exc:
        _raise_check({"unreached": f"{job.channel}: {exc}"})
    session = TaskSession(job, client)
    try:
        return list(run_spark_task(job, batches, session=session))
    finally:
        session.finish()  # if the task ended before its ranks' session did


def _raise_check(found: dict[str, Any]) -> NoReturn:
    raise RuntimeError(f"sparktrain's first-stage check {_mark(found, CHECK_MARK, CHECK_END)}")


def _run_detached(
    job: TaskJob, session: DetachedSession, batches: Iterator[Any]
) -> list[dict[str, Any]]:
    from sparktrain.task.entry import run_spark_task

    try:
        records = list(run_spark_task(job, batches, session=session))
    finally:
        session.close_logs()
    # Every task meets the others here once its ranks have ended: a failed task's error then
    # goes out only when no rank of the run is still running (within the time a stop gives
    # ranks). A task with no failure (its ranks returned, or an MPI task that holds no rank)
    # comes too, or a failed task would wait out that time for nothing.
    session.others_ended(job.run_config.grace_period + PEER_FAILURE_WAIT)
    outcomes = [RankOutcome.from_json(r) for r in records]
    failed = [
        (o.failure, o.failure.to_json())
        for o in outcomes
        if o.status is RankStatus.FAILED and o.failure is not None
    ]
    if failed:
        # One record travels in the job's error: the task's root cause, as the client would
        # choose it among them (an MPI launcher's task holds every rank's record, rank 0's
        # first, and rank 0's collective that lost its peer is no root cause).
        root, failure = min(failed, key=lambda pair: root_cause_order(pair[0]))
        if root.follows_peer_loss:
            # Spark reports the first task error it sees, and this one only followed a peer's
            # loss: give the peer's own failure time to end the stage (which kills this task)
            # before offering this one instead.
            threading.Event().wait(job.run_config.grace_period + PEER_FAILURE_WAIT)
        raise RuntimeError(f"a rank failed {_mark(failure, FAILURE_MARK, FAILURE_END)}")
    return records


def failure_in(text: str) -> dict[str, Any] | None:
    """The failure record a detached task raised, found in the text of the job's error."""
    return _marked(text, FAILURE_MARK, FAILURE_END)


def check_in(text: str) -> dict[str, Any] | None:
    """What a first stage's task found (``versions``: the differences, or ``unreached``: why
    the channel was not reached), from the text of the job's error; None if no task said."""
    return _marked(text, CHECK_MARK, CHECK_END)


def _mark(data: dict[str, Any], mark: str, end_mark: str) -> str:
    """``data`` as text that survives inside a job's error, for :func:`_marked` to find."""
    return f"{mark}{base64.b64encode(json.dumps(data).encode()).decode()}{end_mark}"


def _marked(text: str, mark: str, end_mark: str) -> dict[str, Any] | None:
    start = text.find(mark)
    end = text.find(end_mark, start)
    if start < 0 or end < 0:
        return None
    try:
        data = json.loads(base64.b64decode(text[start + len(mark) : end]))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def mismatches(client: dict[str, str], executor: dict[str, str]) -> list[str]:
    """``name: client X, executors Y`` for each version that differs (Python: minor only)."""
    return [
        f"{name}: client {client[name]}, executors {executor.get(name, 'missing')}"
        for name in client
        if executor.get(name) != client[name]
    ]


def versions() -> dict[str, str]:
    """This interpreter's Python minor version and the versions of :data:`PACKAGES`."""
    from importlib import metadata

    found = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found
