"""Whether every rank sees the same directory at a local path: not once the ranks run on more
than one host, unless the path is one file system mounted on every host, which is checked.

Used by checkpoints (``checkpoint_dir``) and the DataFrame converter's cache. A local path on
several hosts is refused: each host would see a directory of its own, and a restart on another
host would start from scratch without a word. Where the user says the path is shared
(``shared=True``), rank 0 writes a marker file there and every rank on another host must see
it, within the run's ``start_timeout``.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from pathlib import Path

from sparktrain import contract
from sparktrain.errors import ConfigurationError

# Where rank 0 leaves its markers, inside the shared directory.
MARKER_DIR = ".sparktrain-shared"
# Markers of other runs older than this are removed by rank 0 (a crashed run leaves its own).
STALE_MARKER = 24 * 3600.0
# Between two looks for rank 0's marker; a file system mount shows it within this.
POLL = 0.1
# Without a run's start_timeout (a rank started by hand): how long to wait for rank 0.
DEFAULT_WAIT = 60.0


def spans_hosts() -> bool:
    """Whether this run's ranks are on more than one host (False outside a run).

    sparktrain says how many hosts there are; a node (``LOCAL_WORLD_SIZE``) may be a Spark
    task, several to a host. Under another launcher (torchrun), a node is taken for a host.
    """
    hosts = os.environ.get(contract.NUM_HOSTS_ENV)
    if hosts:
        try:
            return int(hosts) > 1
        except ValueError:
            return False
    local = os.environ.get("LOCAL_WORLD_SIZE")
    world = os.environ.get("WORLD_SIZE")
    if local is None or world is None:
        return False
    try:
        return int(local) < int(world)
    except ValueError:
        return False


def check_shared(what: str, where: str, local_path: str | None, shared: bool, fix: str) -> None:
    """Refuse a local directory that the ranks' hosts do not share.

    Args:
        what: what the directory is for, e.g. ``"checkpoint directory"``.
        where: the directory as the user gave it.
        local_path: its path on this host, or None when it is a remote URL (always shared).
        shared: the user's word that the path is one file system mounted on every host; it
            is then checked (see :func:`verify_shared`).
        fix: how the user says so, e.g. ``"pass shared=True"``.

    Raises:
        ConfigurationError: a local path while the ranks span hosts, not declared shared; or
            declared shared but not seen alike from this host.
    """
    if local_path is None or not spans_hosts():
        return
    if shared:
        verify_shared(what, where, local_path)
        return
    raise ConfigurationError(
        f"{what} {where!r} is a local path, but this run's ranks are on more than one host "
        f"({_spread()}): each host has its own disk, so a restart on another host would not find "
        "what was written there and would start from scratch. Use a URL every host reaches "
        f"(s3://..., gs://..., abfss://...), or, when the path is a file system mounted on "
        f"every host (NFS, /dbfs), {fix}"
    )


def verify_shared(what: str, where: str, local_path: str) -> None:
    """Check, once per run attempt and directory, that every host sees ``local_path`` alike.

    Rank 0 writes a marker named after the run and attempt; ranks on its host see it as it
    does; every rank on another host waits for it (up to the run's ``start_timeout``).

    Raises:
        ConfigurationError: the marker did not appear here in time: the path is not shared;
            the message names this host and rank 0's.
    """
    run = os.environ.get(contract.RUN_ID_ENV, "")
    attempt = os.environ.get(contract.ATTEMPT_ENV, "0")
    _verify(what, where, os.path.abspath(local_path), f"{run}-{attempt}")


@functools.lru_cache(maxsize=64)
def _verify(what: str, where: str, path: str, marker_name: str) -> None:
    """:func:`verify_shared`, remembered on success for this process's run attempt."""
    folder = Path(path) / MARKER_DIR
    marker = folder / marker_name
    rank0_host = os.environ.get(contract.RANK0_HOST_ENV, "rank 0's host")
    host = os.environ.get(contract.HOST_ENV, "this host")
    if os.environ.get("RANK", "0") == "0":
        _write_marker(folder, marker, host)
        return
    if _on_rank0_host():
        return  # rank 0's own host: the same disk as rank 0, whatever it is
    wait = _wait_limit()
    deadline = time.monotonic() + wait
    while not marker.exists():
        if time.monotonic() >= deadline:
            raise ConfigurationError(
                f"{what} {where!r} was declared shared (mounted on every host), but it is not "
                f"the same directory on every host: the file rank 0 writes there on "
                f"{rank0_host} ({marker}) did not appear on {host} within {wait:g}s "
                f"(start_timeout). A restart on another host would not find what was written "
                "there. Use a URL every host reaches (s3://..., gs://..., abfss://...) or a "
                "file system mounted on every host (NFS, /dbfs)"
            )
        time.sleep(POLL)  # a file system gives no event across hosts to wait on


def _write_marker(folder: Path, marker: Path, host: str) -> None:
    """Rank 0's marker, written whole (a peer never reads half of it); stale ones go."""
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".{marker.name}.{uuid.uuid4().hex}"
    part.write_text(host, encoding="utf-8")
    os.replace(part, marker)
    now = time.time()
    for old in folder.iterdir():
        try:
            if old != marker and now - old.stat().st_mtime > STALE_MARKER:
                old.unlink()
        except OSError:
            continue


def _spread() -> str:
    """How the ranks are spread over hosts, in words."""
    world = os.environ.get("WORLD_SIZE")
    hosts = os.environ.get(contract.NUM_HOSTS_ENV)
    if hosts:
        return f"{world} ranks on {hosts} hosts"
    return f"{os.environ.get('LOCAL_WORLD_SIZE')} of {world} ranks on this one"


def _on_rank0_host() -> bool:
    """Whether this rank runs on rank 0's host (by the addresses the tasks gave; under
    another launcher, whether it is on node 0)."""
    host, rank0_host = os.environ.get(contract.HOST_ENV), os.environ.get(contract.RANK0_HOST_ENV)
    if host and rank0_host:
        return host == rank0_host
    return os.environ.get("NODE_RANK", "0") == "0"


def _wait_limit() -> float:
    try:
        return max(POLL, float(os.environ.get(contract.START_TIMEOUT_ENV, DEFAULT_WAIT)))
    except ValueError:
        return DEFAULT_WAIT
