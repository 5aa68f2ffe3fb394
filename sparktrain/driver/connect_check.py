"""Before and during the first run from a Spark Connect session: can the cluster run it, and
how?

The slot check reads the static conf only: a Connect client cannot see executors, their free
slots or other jobs' tasks (Spark's own barrier check then waits for slots, as it does on a
classic session when executors are still coming up), so it says so, once per session, before
the first stage can wait.

The rest is checked inside the session's first barrier stage, not by a job before it (which
cost a job's round on every first call): each task compares the executors' Python and package
versions with the client's, and whether it can open a connection to the client's channel
(see :mod:`sparktrain.task.connect_stage`). Versions that differ where pickles cross are refused,
with what to change, rather than as an unpickling error in a rank; a task that cannot reach
the client ends the stage before any rank starts, and the run starts again detached (results
and failures through the Spark job), as do the session's later runs. Once a first stage has
passed the checks they are not made again in the session.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from sparktrain.config import RunConfig, conf_key
from sparktrain.driver.launch.connect import client_address
from sparktrain.errors import CapacityError, ConfigurationError
from sparktrain.log import get_logger
from sparktrain.task.connect_stage import check_in

_log = get_logger(__name__)

_LOCAL = re.compile(r"^local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")

# Spark's own words for a worker on another Python (its error class is
# PYTHON_VERSION_MISMATCH from 3.5 on), not a user's "different version" anywhere in the text.
SPARK_PYTHON_MISMATCH = "Python in worker has different version"


@dataclasses.dataclass(frozen=True)
class ConnectPlan:
    """How runs from one Connect session reach the client.

    Attributes:
        address: where executors reach this client's channel.
        reachable: whether they can; False runs the tasks detached. Until ``checked``, what
            the setting says, or True to be found out by the first stage.
        slots: the task slots the session's conf promises, or None when it cannot say; the
            runs of this process on the same server take turns within them.
        checked: whether a stage of the session has checked the executors' versions and
            (attached) that they reach the client; until then each stage's tasks do.
    """

    address: str
    reachable: bool
    slots: int | None = None
    checked: bool = False


class ClientUnreachable(Exception):
    """A first stage's task could not connect to the client (internal: the run goes detached)."""


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


def plan_connect(session: Any, config: RunConfig, ranks_per_task: int = 1) -> ConnectPlan:
    """How the session's runs start, before any job: the slots the conf gives, the address
    the executors are to reach, and, unless a setting says, attached until the first stage
    finds otherwise.

    Raises:
        CapacityError: the conf promises fewer task slots than the run needs.
    """
    slots = check_slots(session, config.world_size, ranks_per_task)
    address = config.client_address or client_address(session)
    reachable = True if config.client_reachable is None else config.client_reachable
    return ConnectPlan(address=address, reachable=reachable, slots=slots)


def stage_verdict(error: BaseException) -> Exception | None:
    """What a failed stage of a session's first run means for the session, if anything: a
    :class:`ConfigurationError` (versions differ), or :class:`ClientUnreachable`."""
    text = str(error)
    if "PYTHON_VERSION_MISMATCH" in text or SPARK_PYTHON_MISMATCH in text:
        return ConfigurationError(
            "the executors run another Python minor version than this client: "
            f"{_first(text)}; use the same Python on both sides"
        )
    found = check_in(text)
    if not found:
        return None
    if found.get("versions"):
        return ConfigurationError(
            "the executors' Python and packages must match this client's where pickles cross ("
            + "; ".join(dict.fromkeys(found["versions"]))
            + "): install the same versions on both sides (spark.pyspark.python names the "
            "executors' interpreter)"
        )
    if "unreached" in found:
        return ClientUnreachable(str(found["unreached"]))
    return None


def unreached_plan(plan: ConnectPlan, config: RunConfig, why: ClientUnreachable) -> ConnectPlan:
    """The session's plan once a first stage's task could not reach the client: detached,
    with a warning that says what is lost and how to get it back.

    Raises:
        ConfigurationError: the ``client_reachable`` setting says the executors reach it.
    """
    if config.client_reachable:
        raise ConfigurationError(
            f"the executors cannot reach this client at {plan.address} ({why}), but "
            f"{conf_key('client_reachable')} says they can: unset it to run detached, or set "
            f"{conf_key('client_address')} to an address they can reach"
        ) from why
    _log.warning(
        "executors cannot reach this client at %s (%s): results and failures come back "
        "through the Spark job, without live logs or progress; set %s to a folder the "
        "executors write and this client reads to see the ranks' output, or %s to an "
        "address they can reach",
        plan.address,
        why,
        conf_key("log_dir"),
        conf_key("client_address"),
    )
    return dataclasses.replace(plan, reachable=False, checked=True)


def _first(text: str) -> str:
    for line in text.splitlines():
        if "version" in line:
            return line.strip()[:300]
    return text.splitlines()[0][:300] if text else ""
