"""np > 0 from a Spark Connect session: the barrier stage as ``mapInArrow(barrier=True)``.

A Connect client has no SparkContext: no RDDs, job groups, broadcasts or status tracker. So
the stage is a DataFrame of ``np`` partitions mapped by a barrier ``mapInArrow`` whose rows are
the tasks' pickled records; the job carries a tag of its own, and cancelling interrupts that
tag. The payload travels inside the plan (Connect has no broadcast), one gRPC message: a
payload that cannot fit in it is refused before the stage starts (:func:`check_payload`).
"""

from __future__ import annotations

import collections
import functools
import pickle
import socket
import threading
from collections.abc import Callable
from typing import Any

from sparktrain.driver.launch.stage import FailedTask, describe_spark_error, failed_task
from sparktrain.errors import PayloadError, WorkerFailure
from sparktrain.rank_outcome import RankStatus
from sparktrain.task.assignment import TaskJob
from sparktrain.task.connect_stage import RECORD_COLUMN, failure_in, record_schema, run_connect_task

Done = Callable[[list[dict[str, Any]] | None, BaseException | None], None]

# The largest message a Connect client sends when its channel does not say (pyspark's default,
# and the server's spark.connect.grpc.maxInboundMessageSize default).
GRPC_MESSAGE_LIMIT = 128 << 20
# Room kept in the plan's message for all but the payload (the stage, the job's settings).
PLAN_ROOM = 1 << 20


def session_conf(session: Any) -> Any:
    """A Connect session's conf for one run's checks: a snapshot of every set key, taken in
    one round trip (``getAll``, pyspark 4), or, from older clients, the session's runtime conf
    itself (a round trip per key read). Either answers ``get(key, default)``."""
    try:
        every = session.conf.getAll  # a property, not a method
    except Exception:  # noqa: BLE001 - older clients: ask for each key
        return session.conf
    if isinstance(every, dict):
        return {str(k): str(v) for k, v in every.items() if v is not None}
    return session.conf


def sparktrain_conf(conf: Any, keys: list[str]) -> dict[str, str]:
    """The ``spark.sparktrain.*`` entries of ``keys`` that ``conf`` (see :func:`session_conf`)
    sets."""
    if isinstance(conf, dict):
        return {k: v for k, v in conf.items() if k in keys}
    found: dict[str, str] = {}
    for key in keys:
        value = conf.get(key, None)
        if value is not None:
            found[key] = str(value)
    return found


def server_endpoint(session: Any) -> tuple[str, int] | None:
    """The Connect server's host and port, as the client dials it."""
    try:
        endpoint = str(session.client._builder.endpoint)
    except Exception:  # noqa: BLE001 - internal API; the caller then needs client_address
        return None
    host, _, port = endpoint.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def shared_slots(session: Any) -> str:
    """A name for the task slots a session's runs share: its server's (whose sessions all
    run on one cluster), or the session's own when the server's address is not known."""
    endpoint = server_endpoint(session)
    if endpoint is None:
        return f"connect:{session.session_id}"
    return f"connect:{endpoint[0]}:{endpoint[1]}"


def client_address(session: Any) -> str:
    """The address of this machine on the way to the Connect server.

    The executors are near the server, so the address this machine uses to reach the server
    is the best guess at one they can use to reach it. A UDP ``connect`` sends nothing: it only
    asks the kernel for the route.
    """
    endpoint = server_endpoint(session)
    if endpoint is None:
        return "127.0.0.1"
    host, port = endpoint
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as sock:
            sock.connect(family[4])
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def message_limit(session: Any) -> int:
    """The largest gRPC message ``session``'s client sends (its channel's own setting)."""
    try:
        options = list(session.client._builder._channel_options)  # internal API
    except Exception:  # noqa: BLE001 - another client: the default
        return GRPC_MESSAGE_LIMIT
    for name, value in options:
        if name == "grpc.max_send_message_length":
            try:
                return int(value) if int(value) > 0 else GRPC_MESSAGE_LIMIT
            except (TypeError, ValueError):
                break
    return GRPC_MESSAGE_LIMIT


def check_payload(session: Any, job: TaskJob) -> None:
    """Refuse a run whose pickled function and arguments cannot travel in one plan.

    Raises:
        PayloadError: the payload and the room the plan needs beside it exceed the client's
            gRPC message limit; the message gives both sizes and the ways out.
    """
    size = len(job.payload) + len(job.hook or b"")
    limit = message_limit(session)
    if size + PLAN_ROOM <= limit:
        return
    raise PayloadError(
        f"the pickled function and arguments take {size / (1 << 20):.1f} MiB, and a run from a "
        f"Spark Connect session sends them in one gRPC message of at most "
        f"{limit / (1 << 20):.1f} MiB ({PLAN_ROOM >> 20} MiB of it kept for the rest of the "
        "plan): pass large data as a path both sides read (or a Spark DataFrame converter) "
        "and load it in the function, instead of capturing it; or raise the message limit on "
        "both sides (the client's channel option grpc.max_send_message_length and the "
        "server's spark.connect.grpc.maxInboundMessageSize)"
    )


class ConnectLaunch:
    """Runs the barrier stage from a driver thread; :meth:`cancel` interrupts its job tag.

    Args:
        spark: the Connect SparkSession.
        job: what every task gets; an empty ``channel`` runs the tasks detached.
        description: a label for the job's tag.

    Raises:
        PayloadError: the payload cannot travel in one plan (:func:`check_payload`).
    """

    def __init__(self, spark: Any, job: TaskJob, description: str, frame: Any = None) -> None:
        check_payload(spark, job)
        self.spark = spark
        # A run given a DataFrame: the stage runs over its partitions, repartitioned to n.
        self.frame = frame
        self.job = job
        self.n = job.tasks
        self.tag = f"sparktrain-{job.run_id}-{job.attempt}"
        self.description = description
        # Detached tasks never say hello: the monitor then waits on the job alone.
        self.detached = not job.channel
        # The error the stage's job raised, if it did (a first stage's check is read from it).
        self.stage_error: BaseException | None = None
        self._cancelled = threading.Event()

    def start(self, done: Done) -> None:
        task = functools.partial(run_connect_task, self.job)

        def body() -> None:
            # Tags are kept per thread by the Connect client: set it in the thread that runs.
            self.spark.addTag(self.tag)
            try:
                source = (
                    _tasks_frame(self.spark, self.n)
                    if self.frame is None
                    else self.frame.partitioned(self.n)
                )
                stage = source.mapInArrow(task, record_schema(), barrier=True)
                records = [pickle.loads(value) for value in _column(stage, RECORD_COLUMN)]
            except BaseException as exc:  # noqa: BLE001 - handed to the monitor
                self.stage_error = exc
                try:
                    records = [_failed_record(failure_in(str(exc)))]
                except ValueError:  # no failure record (or a malformed one) in the error
                    done(None, exc)
                else:
                    done(records, None)
            else:
                done(records, None)
            finally:
                try:
                    self.spark.removeTag(self.tag)
                except Exception:  # noqa: BLE001 - the session may be gone
                    pass

        threading.Thread(target=body, name="sparktrain-connect-stage", daemon=True).start()

    def cancel(self) -> None:
        """Interrupt every operation of the run's tag; the tasks' workers die with them."""
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        try:
            self.spark.interruptTag(self.tag)
        except Exception:  # noqa: BLE001 - the session may already be stopped
            pass

    def describe_error(self, error: BaseException) -> str:
        return describe_spark_error(error)

    def failed_task(self, error: BaseException) -> FailedTask | None:
        return failed_task(error, self.job.ranks_per_task)


# The input of each session's stages, by (session id, tasks): see _tasks_frame.
_TASK_FRAMES: collections.OrderedDict[tuple[str, int], Any] = collections.OrderedDict()
_TASK_FRAMES_KEPT = 16
_task_frames_lock = threading.Lock()


def _tasks_frame(spark: Any, n: int) -> Any:
    """The ``n``-partition input of a run's stage: one row per task.

    ``mapInArrow`` reads its input's columns, which costs a round trip to the server for a
    new ``range`` frame; the same frame object keeps its schema once asked, so each session's
    later runs of ``n`` tasks reuse it (a frame is only a plan: nothing of a past job stays).
    """
    key = (str(getattr(spark, "session_id", id(spark))), n)
    with _task_frames_lock:
        frame = _TASK_FRAMES.get(key)
        if frame is None:
            frame = _TASK_FRAMES[key] = spark.range(0, n, 1, n)
            while len(_TASK_FRAMES) > _TASK_FRAMES_KEPT:
                _TASK_FRAMES.popitem(last=False)
        _TASK_FRAMES.move_to_end(key)
        return frame


def _column(frame: Any, name: str) -> list[bytes]:
    """Run ``frame``'s job and return column ``name``, from the Arrow table the server sent.

    ``collect()`` would also read ``spark.sql.execution.pyspark.binaryAsBytes`` (one more
    round trip on every call) and build a ``Row`` per record; the client's table is taken as
    it arrives where it offers it (``_to_table``, pyspark 3.4 to 4.x).
    """
    to_table = getattr(frame, "_to_table", None)
    if not callable(to_table):
        return [row[name] for row in frame.collect()]
    values: list[bytes] = to_table()[0].column(name).to_pylist()
    return values


def _failed_record(failure: dict[str, Any] | None) -> dict[str, Any]:
    """A task record for the failure a detached task raised.

    Raises:
        ValueError: ``failure`` is None or not a failure record.
    """
    if failure is None:
        raise ValueError("no failure record")
    return {
        "rank": WorkerFailure.from_json(failure).rank,
        "status": RankStatus.FAILED.value,
        "failure": failure,
    }
