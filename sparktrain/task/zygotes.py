"""Warm starts: ranks forked from a process that already imported torch and sparktrain.

The first run of a task's Python process starts its ranks cold, as new interpreters, and
once they have ended a zygote (:mod:`sparktrain.worker.zygote`) with their environment, less
the variables read only once a rank runs; each rank of the later runs with the same
environment is forked from it, ready in milliseconds instead of the seconds a new interpreter
spends importing torch. The zygote loads after the cold ranks, not beside them: loading
torch beside them would take the CPU they need for their own imports and first steps (on a
2-core host it doubled the time a cold rank took to import torch), and a rank that finds its
zygote still loading waits for it (up to :data:`LOAD_WAIT`), which is never slower than a new
interpreter importing the same modules beside it. A task's zygote waits later still, until
the driver has the task's output (its ``hold``, see :mod:`sparktrain.worker.zygote`): the
session's first job ends while it loads otherwise, and on a small host that end, Spark's own
first pass through its result path, then shares the CPU with it. A rank whose environment
differs on any other variable (another ``OMP_NUM_THREADS``, a new ``PYTHONPATH``) gets a
zygote of its own.

A task's Python worker is reused by the other Spark jobs of the session, and some leave
per-call variables in its environment, which the ranks inherit: TorchDistributor's tasks set
a new rendezvous id (and, with a DataFrame, its input files) on every call. From a Spark
Connect session both runners' stages are ``mapInArrow`` jobs sharing the same workers, so
each such call would change the key and start the next run cold. Those variables are read
only by their own job's code once it runs, never while Python, torch and sparktrain load, so
the key leaves them out (:data:`RUNTIME_ONLY`) and a forked rank gets them as they are.

On the driver (``np < 0``) a zygote lives as long as the process that started it; in an
executor, as long as the executor's Python daemon, serving each later Python worker of the
executor (:mod:`sparktrain.task.zygote_share`); either way no longer than
:data:`~sparktrain.task.zygote_client.ZYGOTE_IDLE` seconds without work. At most
:data:`MAX_ZYGOTES` are kept per process; the oldest idle one goes first, and while every
one kept has ranks running, a rank of yet another environment starts cold. This module
chooses the zygote; :mod:`sparktrain.task.zygote_client` talks to one.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
from collections.abc import Mapping

from sparktrain import contract
from sparktrain.log import get_logger
from sparktrain.task.zygote_client import JOIN_WAIT, ForkedRank, Zygote, ZygoteGone
from sparktrain.task.zygote_share import Key, share_path

_log = get_logger(__name__)

__all__ = ["ForkedRank", "Zygote", "ZygoteGone", "import_key", "zygote_for"]

# Zygotes kept per process (one per distinct environment).
MAX_ZYGOTES = 2
# Seconds a rank waits for its zygote to finish loading before it starts cold instead (and
# that zygote is given up): loading takes what a new interpreter's imports take, so only a
# stuck zygote reaches this.
LOAD_WAIT = 60.0

# Variables other jobs' tasks leave in a reused Python worker and that only their own code
# reads, at run time (TorchDistributor's per-call rendezvous id and input files).
RUNTIME_ONLY = frozenset({"SPARK_PARTITION_ARROW_DATA_FILE", "SPARK_DATAFRAME_SCHEMA_FILE"})
RUNTIME_ONLY_PREFIXES = ("PYSPARK_TORCH_DISTRIBUTOR_",)


def read_at_load(name: str) -> bool:
    """Whether a variable may be read while a rank loads (so its zygote must have it)."""
    if contract.late_variable(name):
        return False
    return name not in RUNTIME_ONLY and not name.startswith(RUNTIME_ONLY_PREFIXES)


def import_key(env: Mapping[str, str], cwd: str) -> Key:
    """What a rank's process depends on while it loads: interpreter, folder, early variables."""
    early = tuple(sorted((k, v) for k, v in env.items() if read_at_load(k)))
    return (sys.executable, cwd, early)


_zygotes: collections.OrderedDict[Key, Zygote] = collections.OrderedDict()
_zygotes_lock = threading.Lock()
# Environments whose zygote could not fork (it failed to load, or loaded CUDA or threads):
# their ranks start cold without trying again.
_unusable: set[Key] = set()


def _make_room() -> bool:
    """Let the oldest idle zygotes go until there is room for one more (lock held).

    A zygote whose ranks still run is kept: they are its children, and only it can say how
    they end.

    Returns:
        Whether there is room.
    """
    for key in list(_zygotes):
        if len(_zygotes) < MAX_ZYGOTES:
            break
        if _zygotes[key].idle:
            _zygotes.pop(key).close()
    return len(_zygotes) < MAX_ZYGOTES


def _open(key: Key, shared: bool, start: bool = True, hold: int | None = None) -> Zygote | None:
    """This executor's zygote for ``key`` when one answers, else a new one when ``start``
    (lock held)."""
    anchor = os.getppid()
    path = share_path(key, anchor) if shared and anchor > 1 and hasattr(os, "pidfd_open") else None
    try:
        if path is not None:
            with contextlib.suppress(OSError):
                return Zygote.join(path, key)
        if not start:
            return None
        if path is not None:
            with contextlib.suppress(OSError):  # no pidfds here (an old kernel, a sandbox)
                pidfd = os.pidfd_open(anchor)
                try:
                    return Zygote(key, (path, pidfd), hold)
                finally:
                    os.close(pidfd)
        return Zygote(key, hold=hold)  # it serves this process alone
    except OSError as exc:
        _log.debug("no zygote: %s", exc)
        return None


def zygote_for(
    env: Mapping[str, str],
    cwd: str,
    wait: float = 0.0,
    shared: bool = False,
    start: bool = True,
    hold: int | None = None,
) -> Zygote | None:
    """A loaded zygote for ranks with ``env`` in ``cwd``; one is started if none fits and
    ``start`` says so.

    Args:
        wait: how long to wait for a zygote that is still loading; 0 does not wait (it will
            serve a later call). One not loaded after a ``wait`` above 0 is given up: this
            process's ranks of that environment start cold from then on.
        shared: this process is a Spark executor's Python worker: a zygote of the executor
            (another worker started it) is used where one answers, and one started here
            serves the executor's later workers too, until the executor ends.
        start: start one when none fits (a launcher asks for that once its cold ranks have
            ended, so that it does not load beside them).
        hold: an fd a zygote started now waits to see end before it loads.

    Returns:
        None when no loaded zygote can be had now: start the rank cold.
    """
    key = import_key(env, cwd)
    with _zygotes_lock:
        if key in _unusable:
            return None
        zygote = _zygotes.get(key)
        if zygote is None or zygote.gone:
            if zygote is not None:
                del _zygotes[key]
            if not _make_room():
                return None  # every zygote kept has ranks running: this one starts cold
            found = _open(key, shared, start, hold)
            if found is None:
                return None
            zygote = _zygotes[key] = found
        _zygotes.move_to_end(key)
    # One another process started has loaded: it answers at once.
    if not zygote.loaded(wait if zygote.proc is not None else max(wait, JOIN_WAIT)):
        if wait <= 0:
            return None  # still loading: it will serve a later run
        _log.warning(
            "a zygote (pid %s) did not load within %gs: ranks of this environment start "
            "cold in this process from now on",
            zygote.pid,
            wait,
        )
    elif zygote.usable():
        return zygote
    with _zygotes_lock:
        if _zygotes.get(key) is zygote:
            del _zygotes[key]
        if zygote.info is not None or not zygote.loaded():
            # It loaded and cannot fork, or it is stuck: the same would happen again.
            _unusable.add(key)
    zygote.close()
    return None
