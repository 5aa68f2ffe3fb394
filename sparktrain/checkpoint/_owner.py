"""Which run owns a checkpoint directory, so that two runs never interleave their saves.

The owner record (``sparktrain-owner.json``) names the run id, host, pid and when the run
claimed the directory. A run id is kept by restarted attempts of one run (``RUN_ID_ENV``);
without one, each process is its own run.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from sparktrain.checkpoint._errors import CheckpointOwnershipError, warn
from sparktrain.checkpoint._store import _Store
from sparktrain.log import get_logger
from sparktrain.worker.context import RUN_ID_ENV

_log = get_logger(__name__)

OWNER_FILE = "sparktrain-owner.json"


def this_process() -> dict[str, Any]:
    """The owner record of this process; the run id comes from ``_SPARKTRAIN_RUN_ID``."""
    import psutil

    started = psutil.Process().create_time()
    host, pid = socket.gethostname(), os.getpid()
    run_id = os.environ.get(RUN_ID_ENV) or f"process-{host}-{pid}-{int(started * 1000)}"
    return {"run_id": run_id, "host": host, "pid": pid, "pid_started": started, "since": None}


def claim(store: _Store, me: dict[str, Any], take_over: bool) -> None:
    """Make this run the directory's owner, or raise if another live run owns it.

    ``take_over`` only displaces a run that claimed the directory before this process
    started, so two live runs that both pass it cannot silently take turns: the older one
    fails at its next save.

    Raises:
        CheckpointOwnershipError: another live run owns the directory.
    """
    owner = _read(store)
    if owner is not None and owner["run_id"] != me["run_id"]:
        dead = _is_dead(owner)
        if not dead and (not take_over or _claimed_later(owner, me)):
            raise _ownership_error(store, owner, me)
        if take_over:  # asked for: said in the log, not as a warning to wonder about
            _log.info("taking over %s from %s (take_over=True)", store.where, _describe(owner))
        else:
            warn(
                f"taking over {store.where} from {_describe(owner)} (its process is gone; "
                "pass take_over=True to say that this run continues it)"
            )
    same = owner is not None and all(owner.get(k) == me[k] for k in ("run_id", "host", "pid"))
    if not same:  # first save of this run, or a restarted attempt of it on another process
        record = dict(me, since=time.time())
        store.write(OWNER_FILE, lambda f: f.write(json.dumps(record).encode()))


def recheck(store: _Store, me: Mapping[str, Any]) -> None:
    """Raise if another run has taken the directory over since :func:`claim`.

    Raises:
        CheckpointOwnershipError: another run owns the directory now.
    """
    owner = _read(store)
    if owner is not None and owner["run_id"] != me["run_id"]:
        raise _ownership_error(store, owner, me)


def _read(store: _Store) -> dict[str, Any] | None:
    try:
        owner = json.loads(store.read(OWNER_FILE))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        warn(f"ignoring unreadable {store.url(OWNER_FILE)}: {exc}")
        return None
    return owner if isinstance(owner, dict) and "run_id" in owner else None


def _is_dead(owner: Mapping[str, Any]) -> bool:
    """True only when ``owner``'s process is known to be gone (same host, pid not running)."""
    import psutil

    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False  # another host: its liveness cannot be seen from here
    try:
        started = psutil.Process(owner["pid"]).create_time()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    recorded = owner.get("pid_started")
    return isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0  # pid reused


def _claimed_later(owner: Mapping[str, Any], me: Mapping[str, Any]) -> bool:
    """Whether another process claimed the directory after this process started."""
    since = owner.get("since")
    mine = owner.get("host") == me["host"] and owner.get("pid") == me["pid"]
    return not mine and isinstance(since, (int, float)) and since >= me["pid_started"]


def _describe(owner: Mapping[str, Any]) -> str:
    since = owner.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    return (
        f"run {owner.get('run_id')!r} (host {owner.get('host')}, pid {owner.get('pid')}, "
        f"writing here since {when})"
    )


def _ownership_error(
    store: _Store, owner: Mapping[str, Any], me: Mapping[str, Any]
) -> CheckpointOwnershipError:
    head = (
        f"checkpoint directory {store.where} belongs to {_describe(owner)}, and this is "
        f"run {me['run_id']!r}; two runs saving into one directory would interleave their "
        "checkpoints."
    )
    if _claimed_later(owner, me):
        return CheckpointOwnershipError(
            f"{head} That run claimed the directory after this process started, so it is "
            "live or newer, and take_over=True does not displace it. Give each run its own "
            "directory."
        )
    return CheckpointOwnershipError(
        f"{head} Fix: give this run another directory; or, if that run has ended and this "
        "one should continue its checkpoints, pass take_over=True to save(); or, if this is "
        f"a restart of that run, set {RUN_ID_ENV}={owner['run_id']} as it had."
    )
