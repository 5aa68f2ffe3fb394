"""Whether every rank sees the same checkpoint directory: a local path does not, once the
ranks run on more than one host."""

from __future__ import annotations

import os

from sparktrain.errors import ConfigurationError


def spans_hosts() -> bool:
    """Whether this run's ranks are on more than one host (False outside a run)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    world = os.environ.get("WORLD_SIZE")
    if local is None or world is None:
        return False
    try:
        return int(local) < int(world)
    except ValueError:
        return False


def check_shared(where: str, is_local: bool, shared: bool) -> None:
    """Refuse a local checkpoint directory when the ranks are on several hosts.

    Each host would see its own directory at that path: rank 0's host would hold the
    checkpoints, and a restart that puts rank 0 on another host would find none and start
    from scratch without a word.

    Args:
        where: the directory as given.
        is_local: whether it is a local path (or ``file://`` URL) rather than a remote URL.
        shared: the caller's word that the path is one file system mounted on every host.

    Raises:
        ConfigurationError: a local path, ranks on several hosts, and ``shared`` not set.
    """
    if not is_local or shared or not spans_hosts():
        return
    raise ConfigurationError(
        f"checkpoint directory {where!r} is a local path, but this run's ranks are on more "
        f"than one host ({os.environ.get('LOCAL_WORLD_SIZE')} of "
        f"{os.environ.get('WORLD_SIZE')} ranks on this one): each host has its own disk, so "
        "a restart on another host would not find the checkpoints and would start from "
        "scratch. Use a URL every host reaches (s3://..., gs://..., abfss://...), or, when "
        "the path is a file system mounted on every host (NFS, /dbfs), pass shared=True"
    )
