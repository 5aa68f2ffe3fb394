"""Before the first run from a Spark Connect session: can the cluster run it, and how?

One small job, with as many tasks as the run's stage, tells the client the executors' Python
and package versions, and whether they can open a connection to this machine. Its tasks start
the Python workers the stage then reuses, on every executor the stage's tasks land on, at once
rather than one executor in the probe and the others while the barrier stage waits for them.
Versions that differ where pickles cross are refused here, with what to change, rather than
as an unpickling error in a task. The slot
check reads the static conf only: a Connect client cannot see executors, their free slots or
other jobs' tasks (Spark's own barrier check then waits for slots, as it does on a classic
session when executors are still coming up), so it says so, once per session, before the
first stage can wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from sparktrain.config import RunConfig, conf_key
from sparktrain.driver.launch.connect import client_address
from sparktrain.driver.launch.stage import describe_spark_error
from sparktrain.errors import CapacityError, ConfigurationError
from sparktrain.log import get_logger
from sparktrain.task.connect import probe_task, versions
from sparktrain.wire.address import listen_address

_log = get_logger(__name__)

# How long the probe task tries to open a connection to the client.
REACH_TIMEOUT = 5.0
_LOCAL = re.compile(r"^local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


@dataclasses.dataclass(frozen=True)
class ConnectPlan:
    """How runs from one Connect session reach the client.

    Attributes:
        address: where executors reach this client's channel.
        reachable: whether they can (every probe task could); False runs the tasks detached.
        executor: what the first probe task said of its executor (versions, host).
        slots: the task slots the session's conf promises, or None when it cannot say; the
            runs of this process on the same server take turns within them.
    """

    address: str
    reachable: bool
    executor: dict[str, str]
    slots: int | None = None


def static_slots(conf: dict[str, str | None]) -> int | None:
    """Task slots that the session's static conf promises, or None when it cannot say.

    Args:
        conf: ``spark.master``, ``spark.executor.instances``, ``spark.executor.cores``,
            ``spark.task.cpus`` and ``spark.dynamicAllocation.enabled`` as the session reads them.
    """
    master = (conf.get("spark.master") or "").strip()
    task_cpus = int(conf.get("spark.task.cpus") or 1)
    local = _LOCAL.match(master)
    if local:
        cores = local.group(1)
        if cores == "*":
            return None
        return int(cores or 1) // task_cpus
    cluster = _LOCAL_CLUSTER.match(master)
    if cluster:
        return int(cluster.group(1)) * int(cluster.group(2)) // task_cpus
    if (conf.get("spark.dynamicAllocation.enabled") or "false").lower() == "true":
        return None
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances and cores:
        return int(instances) * int(cores) // task_cpus
    return None


def check_slots(session: Any, np: int, ranks_per_task: int = 1) -> int | None:
    """Refuse ``np`` ranks that the static conf cannot run at once (see the module's note).

    Slots count tasks: with ``ranks_per_task`` k (k GPUs per task), np ranks need np / k.

    Returns:
        The task slots the conf promises, or None when it cannot say.

    Raises:
        CapacityError: the conf promises fewer slots than the run's tasks.
    """
    tasks = np // ranks_per_task
    keys = (
        "spark.master",
        "spark.executor.instances",
        "spark.executor.cores",
        "spark.task.cpus",
        "spark.dynamicAllocation.enabled",
    )
    conf: dict[str, str | None] = {}
    for key in keys:
        try:
            conf[key] = session.conf.get(key, None)
        except Exception:  # noqa: BLE001 - a server may refuse to show a key
            conf[key] = None
    try:
        slots = static_slots(conf)
    except ValueError:
        slots = None
    if slots is not None and slots < tasks:
        raise CapacityError(
            f"np={np} needs {tasks} task slots at once, but the session's conf gives "
            f"{slots} (spark.master={conf['spark.master']}, spark.task.cpus="
            f"{conf['spark.task.cpus'] or 1}): lower np, or give the cluster more executor cores"
        )
    _log.warning("%s", unseen_slots_note(tasks, slots))
    return slots


def unseen_slots_note(tasks: int, slots: int | None) -> str:
    """What a Connect client says before its first barrier stage: free slots are not seen.

    Args:
        tasks: the task slots the run needs at once.
        slots: the slots the session's static conf promises, or None when it cannot say.
    """
    known = (
        f"the session's conf gives {slots} in all"
        if slots is not None
        else "the session's conf does not say how many the cluster has"
    )
    return (
        f"the run needs {tasks} task slots at once; {known}, and a Spark Connect client cannot "
        "see how many are free: while other jobs hold them, Spark's barrier stage waits for "
        f"them without a message (a run whose executors reach this client fails after "
        f"{conf_key('start_timeout')}; a detached one waits until {conf_key('timeout')})"
    )


def mismatches(client: dict[str, str], executor: dict[str, str]) -> list[str]:
    """``name: client X, executors Y`` for each version that differs (Python: minor only)."""
    return [
        f"{name}: client {client[name]}, executors {executor.get(name, 'missing')}"
        for name in client
        if executor.get(name) != client[name]
    ]


def plan_connect(session: Any, config: RunConfig, ranks_per_task: int = 1) -> ConnectPlan:
    """Probe the cluster once: the executors' versions and whether they reach this client.

    Raises:
        ConfigurationError: the executors' Python minor version, cloudpickle, torch or
            sparktrain differ from the client's, or the probe job failed.
    """
    slots = check_slots(session, config.world_size, ranks_per_task)
    advertise = config.client_address or client_address(session)
    tasks = probe_tasks(config, slots, ranks_per_task)
    with socket.socket(_family(advertise), socket.SOCK_STREAM) as listener:
        listener.bind((listen_address(advertise, _any(advertise)), 0))
        listener.listen(max(64, tasks))
        port = listener.getsockname()[1]
        with _accepting(listener):
            found = _probe(session, f"{advertise}:{port}", config.start_timeout, tasks)
    mine = versions()
    different = list(dict.fromkeys(line for each in found for line in mismatches(mine, each)))
    if different:
        raise ConfigurationError(
            "the executors' Python and packages must match this client's where pickles cross ("
            + "; ".join(different)
            + "): install the same versions on both sides (spark.pyspark.python names the "
            "executors' interpreter)"
        )
    executor = found[0]
    unreached = [each for each in found if each.get("reached", "no") != "yes"]
    reached = not unreached
    if config.client_reachable is not None:
        reachable = config.client_reachable
    else:
        reachable = reached
        if not reached:
            _log.warning(
                "executors cannot reach this client at %s (%s): results and failures come back "
                "through the Spark job, without live logs or progress; set %s to a folder the "
                "executors write and this client reads to see the ranks' output, or %s to an "
                "address they can reach",
                advertise,
                unreached[0].get("reached"),
                conf_key("log_dir"),
                conf_key("client_address"),
            )
    return ConnectPlan(address=advertise, reachable=reachable, executor=executor, slots=slots)


@contextlib.contextmanager
def _accepting(listener: socket.socket) -> Iterator[None]:
    """Accept and close the probe tasks' connections while the block runs, so that however
    many tasks connect at once none waits on a full backlog and is taken for unreachable."""
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the timeout, or the listener closed
                continue
            conn.close()

    thread = threading.Thread(target=accept, name="sparktrain-connect-reach", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _any(address: str) -> str:
    return "::" if ":" in address else "0.0.0.0"


def probe_tasks(config: RunConfig, slots: int | None, ranks_per_task: int = 1) -> int:
    """How many tasks the probe job runs: the run's stage's, within the slots the conf gives."""
    tasks = max(1, config.world_size // ranks_per_task)
    return tasks if slots is None else max(1, min(tasks, slots))


def _probe(session: Any, address: str, timeout: float, tasks: int = 1) -> list[dict[str, str]]:
    """Run the probe job (``tasks`` tasks, not a barrier), within ``timeout`` seconds; what
    each task said of its executor."""
    tag = f"sparktrain-probe-{uuid.uuid4().hex[:12]}"
    result: dict[str, Any] = {}
    finished = threading.Event()

    def body() -> None:
        session.addTag(tag)
        try:
            task = functools.partial(probe_task, address, REACH_TIMEOUT)
            frame = session.range(0, tasks, 1, tasks).mapInArrow(task, "probe string")
            result["found"] = [json.loads(row["probe"]) for row in frame.collect()]
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result["error"] = exc
        finally:
            try:
                session.removeTag(tag)
            except Exception:  # noqa: BLE001 - the session may be gone
                pass
            finished.set()

    threading.Thread(target=body, name="sparktrain-connect-probe", daemon=True).start()
    if not finished.wait(timeout + REACH_TIMEOUT):
        session.interruptTag(tag)
        raise ConfigurationError(
            f"the cluster did not run the {tasks}-task probe job within {timeout:g}s "
            f"({conf_key('start_timeout')}): check that it has executors"
        )
    error = result.get("error")
    if error is not None:
        text = str(error)
        if "PYTHON_VERSION_MISMATCH" in text or "different version" in text:
            raise ConfigurationError(
                "the executors run another Python minor version than this client: "
                f"{_first(text)}; use the same Python on both sides"
            ) from error
        raise ConfigurationError(
            f"the probe job before the run failed: {describe_spark_error(error)}"
        ) from error
    return [dict(each) for each in result["found"]]


def _first(text: str) -> str:
    for line in text.splitlines():
        if "version" in line:
            return line.strip()[:300]
    return text.splitlines()[0][:300] if text else ""
