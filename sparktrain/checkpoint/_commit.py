"""Rank 0 tells the other ranks that a checkpoint is committed, so ``save`` returns on every
rank only once the checkpoint is there to load.

This goes through the process group's own key-value store (the one ``init_process_group``
made, at ``MASTER_ADDR:MASTER_PORT``), not through a collective: rank 0 never waits for the
others, so code that calls ``save`` on rank 0 alone (``if rank == 0: save(...)``) still runs,
and a rank that calls it waits only for rank 0's word. Rank 0 posts its outcome whether the
save worked or failed; a rank 0 that dies takes the store with it, which ends the wait with an
error instead of a hang.

The store has no authentication of its own, and on a cluster anyone who reaches rank 0's port
can write to it. So rank 0 signs its word with the run's key (HMAC-SHA256 over the key's name
and the outcome, the key the ranks got from sparktrain), and a rank reads nothing it cannot
verify: a value that is not sparktrain's shape, or not signed with the run's key, is a
``CheckpointError`` that says so, never a committed checkpoint or the writer's error text.
Outside sparktrain (no run key: torchrun) the word is unsigned, and still checked for shape.

A rank 0 whose function ends right after its save takes the store with it, possibly before a
slower rank has read its word. So a rank that can no longer reach the store reads the
checkpoint's commit marker instead: one written by this run's current attempt (its run id and
attempt number) is rank 0's word too, as the marker is what makes a checkpoint count.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable
from typing import Any

from sparktrain import contract
from sparktrain.checkpoint import layout
from sparktrain.checkpoint._errors import CheckpointError
from sparktrain.worker import context

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


def _run_key() -> bytes | None:
    try:
        return bytes.fromhex(os.environ[contract.KEY_ENV])
    except (KeyError, ValueError):
        return None


def _mac(key: bytes, name: str, outcome: str) -> str:
    message = f"{_PREFIX}\n{name}\n{outcome}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def encode(name: str, outcome: dict[str, str | None], key: bytes | None) -> str:
    """Rank 0's word under the store key ``name``: the outcome, signed when there is a key."""
    text = json.dumps(outcome, sort_keys=True)
    return json.dumps({"outcome": text, "mac": _mac(key, name, text) if key else None})


def decode(name: str, raw: bytes | str, key: bytes | None) -> dict[str, str | None]:
    """The outcome in a value read from the store under ``name``, once its shape (and, with a
    key, its signature) is checked.

    Raises:
        CheckpointError: the value is not what rank 0 writes, or not signed with the run's key.
    """
    where = f"the process group's store holds under {name}"
    try:
        value = json.loads(raw)
        text, mac = value["outcome"], value["mac"]
        if not isinstance(text, str) or not isinstance(mac, (str, type(None))):
            raise TypeError("the outcome or its signature is not a string")
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(
            f"{where} something that is not rank 0's word ({type(exc).__name__}: {exc}): "
            "another process that reaches the store (MASTER_ADDR:MASTER_PORT) wrote it"
        ) from exc
    if key is not None and not (
        isinstance(mac, str) and hmac.compare_digest(mac, _mac(key, name, text))
    ):
        raise CheckpointError(
            f"{where} a value not signed with this run's key, so it is refused: another "
            "process that reaches the store (MASTER_ADDR:MASTER_PORT) wrote it"
        )
    outcome = json.loads(text)
    if (
        not isinstance(outcome, dict)
        or len(outcome) != 1
        or not (
            isinstance(outcome.get("error"), str)
            or ("path" in outcome and isinstance(outcome["path"], (str, type(None))))
        )
    ):
        raise CheckpointError(f"{where} an outcome of an unknown shape: {text[:200]!r}")
    return outcome


def post(where: str, step: int, path: str | None, error: BaseException | None = None) -> None:
    """On rank 0: say that checkpoint ``step`` of ``where`` is committed at ``path``, or why
    it is not (best effort: a store that cannot be reached leaves the other ranks' wait to
    fail on its own)."""
    store = _store()
    if store is None:
        return
    outcome: dict[str, str | None] = (
        {"path": path} if error is None else {"error": f"{type(error).__name__}: {error}"}
    )
    name = _key(where, step)
    try:
        store.set(name, encode(name, outcome, _run_key()))
    except (RuntimeError, OSError):
        pass


def read_marker(read: Callable[[str], bytes], step: int) -> Callable[[], Any]:
    """What :func:`wait` calls to read checkpoint ``step``'s commit marker through ``read``
    (a store's ``read(name)``); None where there is none or it cannot be read."""

    def marker() -> Any:
        try:
            return json.loads(read(layout.marker_name(step)))
        except (OSError, ValueError):
            return None

    return marker


def _ours(marker: Any) -> bool:
    """Whether a commit marker was written by rank 0 of this run's current attempt (known only
    under sparktrain, which gives every rank of a run one run id)."""
    run_id = os.environ.get(contract.RUN_ID_ENV)
    return (
        isinstance(marker, dict)
        and run_id is not None
        and marker.get("run_id") == run_id
        and marker.get("attempt") == context.attempt()
    )


def wait(where: str, step: int, marker: Callable[[], Any] | None = None) -> None:
    """On another rank: return once rank 0 has committed checkpoint ``step`` of ``where``.

    Args:
        where: the checkpoint directory.
        step: the checkpoint's step.
        marker: reads the step's commit marker (:func:`read_marker`): when rank 0 can no
            longer be asked, a marker of this attempt says it committed.

    Raises:
        CheckpointError: rank 0 could not save it, or could no longer be asked (it ended, or
            the process group's timeout passed) and no commit marker of this attempt is
            there, or the store holds a word that is not rank 0's (see :func:`decode`).
    """
    store = _store()
    if store is None:
        return
    name = _key(where, step)
    try:
        raw = store.get(name)
    except (RuntimeError, OSError, ValueError) as exc:
        if marker is not None and _ours(marker()):
            return  # committed; rank 0 ended before this rank asked
        raise CheckpointError(
            f"waited for rank 0 to commit checkpoint {step} of {where}, but it never said it "
            f"had ({type(exc).__name__}: {exc}), and no commit marker of it from this attempt "
            "is there; see rank 0's error, if it had one"
        ) from exc
    try:
        outcome = decode(name, raw, _run_key())
    except CheckpointError as exc:
        raise CheckpointError(
            f"cannot tell whether rank 0 committed checkpoint {step} of {where}: {exc}"
        ) from exc
    if "error" in outcome:
        raise CheckpointError(
            f"rank 0 could not save checkpoint {step} of {where}: {outcome['error']}"
        )
