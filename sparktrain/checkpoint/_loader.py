"""The loader's place beside the model: every rank's state joined into one on rank 0.

Each rank's loader (or sampler) knows only its own rows; the place of the epoch is the states
of all ranks together. ``save(..., loader=loader)`` puts each rank's state in the process
group's store (as JSON, so nothing is unpickled), rank 0 reads all of them and saves their
merged state (:func:`sparktrain.data.resume_state.merge`) under the checkpoint's ``"loader"``
key (a sharded checkpoint: as ``loader.json`` in its folder, which ``load_latest(into=state)``
puts in ``state["loader"]``), which a restarted run at any number of ranks gives to
``load_state_dict``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sparktrain.checkpoint._commit import _store
from sparktrain.errors import ConfigurationError
from sparktrain.worker import context

KEY = "loader"
_PREFIX = "sparktrain.checkpoint.loader"


def own_state(loader: Any) -> Any:
    """This rank's state: ``loader.state_dict()``, or the state(s) given as they are."""
    state_dict = getattr(loader, "state_dict", None)
    return state_dict() if callable(state_dict) else loader


def check_state(state: Any) -> None:
    """Refuse a checkpoint state that cannot take the loader's entry (before any work)."""
    if not isinstance(state, Mapping):
        raise ConfigurationError(
            f"save(..., loader=...) adds a {KEY!r} entry to the state, so the state must be a "
            f"dict (e.g. {{'model': model.state_dict()}}); got {type(state).__name__}"
        )
    if KEY in state:
        raise ConfigurationError(
            f"the state already has a {KEY!r} entry; rename it, or save the loader's state "
            f"yourself instead of passing loader="
        )


def gathered(state: Any, where: str, step: int) -> dict[str, Any] | None:
    """Rank 0: the merged state of every rank's ``state``; other ranks: None.

    Raises:
        ConfigurationError: the ranks cannot be joined (no process group of all the ranks
            while the loader has several shards), or their states do not fit together.
    """
    # Here, not at the top: sparktrain.data's package needs pyarrow (the data extra), and a
    # checkpoint without a loader must not.
    from sparktrain.data import resume_state

    states = resume_state.as_states(state)
    own = len(states) == 1 and states[0].get("kind") == resume_state.SHARD
    store = _store()
    if not own or store is None:
        if own and int(states[0].get("shard_count", 1)) > 1:
            raise ConfigurationError(
                "save(..., loader=loader) joins the states of all ranks through the "
                "torch.distributed process group, and there is none of several ranks; call "
                "dist.init_process_group first, or pass loader=[the states of all ranks]"
            )
        return resume_state.merge(states) if context.rank() == 0 else None
    key = f"{_PREFIX}/{hashlib.sha256(where.encode()).hexdigest()[:16]}/{step}"
    store.set(f"{key}/{context.rank()}", json.dumps(states[0]))
    if context.rank() != 0:
        return None
    count = context.world_size()
    return resume_state.merge(
        [json.loads(bytes(store.get(f"{key}/{rank}")).decode()) for rank in range(count)]
    )
