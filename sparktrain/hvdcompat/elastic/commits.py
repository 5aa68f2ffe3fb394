"""Where an elastic state's commits outlive the process: a checkpoint folder the run names.

In Horovod a failure keeps the surviving processes, which restore the last commit from memory.
In sparktrain a lost rank relaunches every rank as new processes, so a commit that is to
survive must be on storage: when the ranks' environment names a folder
(``SPARKTRAIN_HVD_COMMIT_DIR``, e.g. ``HorovodRunner(np=2, env={...})``), rank 0 writes each
commit there through :mod:`sparktrain.checkpoint` (atomic: a crash at any instant leaves the
previous commit), and ``hvd.elastic.run`` restores the newest one when it starts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from sparktrain import checkpoint
from sparktrain.errors import ConfigurationError
from sparktrain.hvdcompat.basics import rank, size
from sparktrain.worker import context

# The folder (local path on storage every rank sees, or an fsspec URL) that keeps the commits.
COMMIT_DIR_ENV = "SPARKTRAIN_HVD_COMMIT_DIR"
# Commits kept in the folder: the newest, and the one before it while the newest is written.
KEEP_LAST = 2
FORMAT = 1

IN_MEMORY_NOTE = (
    "sparktrain: hvd.elastic commits are kept in memory only, and last only as long as the "
    f"process: a lost rank restarts every rank from the beginning. Set {COMMIT_DIR_ENV} in the "
    "ranks' environment to a folder every rank can reach (e.g. HorovodRunner(np=2, env={"
    f"'{COMMIT_DIR_ENV}': '/dbfs/ckpt/run1'}})) to resume from the last commit"
)

OWN_STATE_NOTE = (
    f"sparktrain: hvd.elastic: {COMMIT_DIR_ENV} is set, but the state is a State subclass of "
    "its own, whose commits are kept in memory only (they last as long as the process): use "
    "hvd.elastic.TorchState or ObjectState to keep them in the folder"
)

# Whether this process has said that its commits are in memory only: said once per process
# (a process may run several elastic functions), as the process is what the commits last as.
_said_in_memory: list[bool] = []

# What weights-only loading reads back: a commit holds nothing else, so a restart can load it.
_PLAIN = (int, float, bool, str, bytes, type(None), torch.Tensor, torch.Size, torch.dtype)


def check_keepable(value: Any, where: str) -> None:
    """Refuse a value a commit could not load back safely (weights-only ``torch.load``).

    Raises:
        ConfigurationError: naming the attribute that holds something else.
    """
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_keepable(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            check_keepable(key, f"{where} key {key!r}")
            check_keepable(item, f"{where}[{key!r}]")
        return
    raise ConfigurationError(
        f"{where} holds a {type(value).__name__}, which a commit to {COMMIT_DIR_ENV} cannot "
        "keep: a restarted rank loads commits weights-only (tensors, numbers, strings, lists, "
        "tuples and dicts of them). Keep such values, or their state_dict(), in the state "
        f"instead, or unset {COMMIT_DIR_ENV} to keep commits in memory only"
    )


@dataclasses.dataclass
class Commits:
    """The commits of one ``hvd.elastic.run``: their folder (None: memory only), the newest
    commit's number (the same on every rank), and how many commits this process made."""

    directory: str | None
    step: int = -1
    made: int = 0

    @classmethod
    def for_run(cls, kept: bool = True) -> Commits:
        """The commits this rank's environment asks for; rank 0 says once per process when
        they last only as long as it (no folder, or a state whose commits cannot be ``kept``
        there)."""
        directory = os.environ.get(COMMIT_DIR_ENV) or None
        if (directory is None or not kept) and rank() == 0 and not _said_in_memory:
            _said_in_memory.append(True)
            context.log_to_driver(IN_MEMORY_NOTE if directory is None else OWN_STATE_NOTE)
        return cls(directory if kept else None)

    def newest(self) -> dict[str, Any] | None:
        """Rank 0's newest commit in the folder (None elsewhere, or when there is none)."""
        if self.directory is None or rank() != 0:
            return None
        found = checkpoint.load_latest(self.directory, map_location="cpu", shared=True)
        if found is None:
            return None
        snapshot: dict[str, Any] = found.state
        if not isinstance(snapshot, dict) or snapshot.get("format") != FORMAT:
            raise ConfigurationError(
                f"{found.path} is not an hvd.elastic commit: {COMMIT_DIR_ENV} must name a "
                "folder of its own, not one that holds other checkpoints"
            )
        snapshot["step"] = found.step
        return snapshot

    def write(self, snapshot: dict[str, Any]) -> None:
        """Commit ``snapshot`` as the next step: rank 0 writes it, every rank returns once
        it is committed (so a restart from here finds it). An empty one (a State subclass
        of the user's own) is not written."""
        self.made += 1
        if self.directory is None or not snapshot:
            return
        self.step += 1
        body = {"format": FORMAT, "world_size": size(), **snapshot}
        checkpoint.save(body, self.directory, self.step, keep_last=KEEP_LAST, shared=True)
