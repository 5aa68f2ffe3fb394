"""Whether every rank sees the same checkpoint directory: a local path does not, once the
ranks run on more than one host (see :mod:`sparktrain.worker.shared_paths`)."""

from __future__ import annotations

from sparktrain.worker import shared_paths


def check_shared(where: str, local_path: str | None, shared: bool) -> None:
    """Refuse a local checkpoint directory that the ranks' hosts do not share.

    Each host would see its own directory at that path: rank 0's host would hold the
    checkpoints, and a restart that puts rank 0 on another host would find none and start
    from scratch without a word.

    Args:
        where: the directory as given.
        local_path: its path on this host, or None when it is a remote URL.
        shared: the caller's word that the path is one file system mounted on every host;
            checked: rank 0's marker there must be seen from every host.

    Raises:
        ConfigurationError: a local path, ranks on several hosts, and ``shared`` not set; or
            ``shared`` set while another host does not see rank 0's marker.
    """
    shared_paths.check_shared("checkpoint directory", where, local_path, shared, "pass shared=True")
