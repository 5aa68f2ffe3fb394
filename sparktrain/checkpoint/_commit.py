"""Rank 0 tells the other ranks that a checkpoint is committed, so ``save`` returns on every
rank only once the checkpoint is there to load.

This goes through the process group's own key-value store (the one ``init_process_group``
made, at ``MASTER_ADDR:MASTER_PORT``), not through a collective: rank 0 never waits for the
others, so code that calls ``save`` on rank 0 alone (``if rank == 0: save(...)``) still runs,
and a rank that calls it waits only for rank 0's word. Rank 0 posts its outcome whether the
save worked or failed; a rank 0 that dies takes the store with it, which ends the wait with an
error instead of a hang.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sparktrain.checkpoint._errors import CheckpointError

_PREFIX = "sparktrain.checkpoint"


def _store() -> Any:
    """The default process group's store, or None without a group of two or more ranks."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _key(where: str, step: int) -> str:
    return f"{_PREFIX}/{hashlib.sha256(where.encode()).hexdigest()[:16]}/{step}"


def post(where: str, step: int, path: str | None, error: BaseException | None = None) -> None:
    """On rank 0: say that checkpoint ``step`` of ``where`` is committed at ``path``, or why
    it is not (best effort: a store that cannot be reached leaves the other ranks' wait to
    fail on its own)."""
    store = _store()
    if store is None:
        return
    outcome = {"path": path} if error is None else {"error": f"{type(error).__name__}: {error}"}
    try:
        store.set(_key(where, step), json.dumps(outcome))
    except (RuntimeError, OSError):
        pass


def wait(where: str, step: int) -> None:
    """On another rank: return once rank 0 has committed checkpoint ``step`` of ``where``.

    Raises:
        CheckpointError: rank 0 could not save it, or could no longer be asked (it ended, or
            the process group's timeout passed).
    """
    store = _store()
    if store is None:
        return
    try:
        outcome = json.loads(store.get(_key(where, step)))
    except (RuntimeError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"waited for rank 0 to commit checkpoint {step} of {where}, but it never said it "
            f"had ({type(exc).__name__}: {exc}); see rank 0's error"
        ) from exc
    if "error" in outcome:
        raise CheckpointError(
            f"rank 0 could not save checkpoint {step} of {where}: {outcome['error']}"
        )
