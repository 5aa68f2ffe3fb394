"""Checkpoints that rank 0 writes atomically, to a local directory or any fsspec URL.

One directory holds one run's checkpoints (the names are :mod:`sparktrain.checkpoint.layout`'s)::

    sparktrain-owner.json             which run writes here (run id, host, pid, since)
    step-000000000120.<token>.pt      torch.save bytes; a fresh name per save, never rewritten
    step-000000000120.commit.json     commit marker: data name, size, sha256; written last
    step-000000000130.<token>.dcp/    a sharded save's data (``save(..., sharded=True)``): every
                                      rank's files, written through torch.distributed.checkpoint;
                                      its marker lists each file's size and sha256

A checkpoint exists only once its commit marker does, and the marker is written only after
its data is complete: fsynced and renamed into place on a local disk; on an object store the
upload has finished, since a PUT is all-or-nothing. A marker names its data object together
with its size and SHA-256, so a data object that is missing, truncated or altered is detected
and skipped. Killing the writer at any instant therefore leaves the previous checkpoint
intact, and pruning (``keep_last``) starts only after the new marker is in place. Pruning
counts intact checkpoints only, checked as ``load_latest`` checks them, so it never deletes
an intact checkpoint to keep a damaged one.

Example:
    >>> ckpt = sparktrain.checkpoint.load_latest("s3://bucket/run1")
    >>> start = 0 if ckpt is None else ckpt.step + 1
    >>> if ckpt is not None:
    ...     model.load_state_dict(ckpt.state["model"])
    >>> for step in range(start, steps):
    ...     ...
    ...     sparktrain.checkpoint.save({"model": model.state_dict()}, "s3://bucket/run1",
    ...                                step, keep_last=3)
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import IO, Any, NamedTuple

from sparktrain.checkpoint import _background, _commit, _loader, _owner, _sharded, layout
from sparktrain.checkpoint._background import PendingSave, wait
from sparktrain.checkpoint._errors import (
    CheckpointError,
    CheckpointOwnershipError,
    CheckpointWarning,
    warn,
)
from sparktrain.checkpoint._integrity import Unusable, verify
from sparktrain.checkpoint._owner import OWNER_FILE as OWNER_FILE  # public, not in __all__
from sparktrain.checkpoint._owner import RUN_ID_ENV
from sparktrain.checkpoint._retention import tidy
from sparktrain.checkpoint._shared import check_shared
from sparktrain.checkpoint._store import _HashingWriter, _Store
from sparktrain.checkpoint.layout import marker_name
from sparktrain.errors import ConfigurationError
from sparktrain.worker import context

__all__ = [
    "RUN_ID_ENV",
    "Checkpoint",
    "CheckpointError",
    "CheckpointOwnershipError",
    "CheckpointWarning",
    "PendingSave",
    "load_latest",
    "save",
    "wait",
]

_FORMAT = 1
_ATTEMPTS = 3  # listings of a directory that a concurrent save keeps pruning


class Checkpoint(NamedTuple):
    """A loaded checkpoint.

    Attributes:
        step: the step it was saved with.
        state: the object given to :func:`save`.
        path: the path or URL of its data file.
    """

    step: int
    state: Any
    path: str


def _directory(directory: object) -> str:
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise ConfigurationError(
            f"checkpoint directory must be a non-empty path or URL, got {directory!r}"
        )
    return str(os.fspath(directory))


def _check_save_args(step: object, keep_last: object) -> None:
    if isinstance(step, bool) or not isinstance(step, int):
        raise ConfigurationError(
            f"checkpoint step must be an int, got {type(step).__name__} {step!r}; "
            "pass the optimizer step or epoch number, e.g. save(state, directory, step=int(i))"
        )
    if step < 0:
        raise ConfigurationError(f"checkpoint step must be >= 0, got {step}")
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ConfigurationError(
            f"keep_last must be an int >= 1 or None (keep every checkpoint), got {keep_last!r}"
        )


def save(
    state: Any,
    directory: str | os.PathLike[str],
    step: int,
    *,
    keep_last: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    take_over: bool = False,
    shared: bool = False,
    loader: Any = None,
    sharded: bool = False,
    asynchronous: bool = False,
) -> str | None | PendingSave:
    """Save ``state`` as checkpoint ``step`` of ``directory``, on rank 0 only.

    Every rank may call it: on other ranks it checks its arguments, waits until rank 0 has
    committed the checkpoint (when a torch.distributed process group of several ranks
    exists), and returns None; so when ``save`` returns on any rank, :func:`load_latest`
    finds the checkpoint there. Rank 0 does not wait for the others, so calling it on rank 0
    alone works too. The checkpoint counts only once complete (see the module docstring), so
    a crash at any instant leaves the previous one loadable. The directory belongs to one run at a time:
    the run id is ``_SPARKTRAIN_RUN_ID`` (kept by restarted attempts of a run), else one per
    process.

    Args:
        state: anything ``torch.save`` can write, e.g. ``{"model": m.state_dict()}``.
        directory: a local path, ``file://`` URL or any fsspec URL (``s3://b/run1``).
        step: the non-negative step number; :func:`load_latest` returns the highest.
        keep_last: after the new checkpoint is committed, keep it and the newest
            ``keep_last - 1`` other intact ones, and delete the rest (None keeps every one).
            Intact means what :func:`load_latest` checks: the data's size and SHA-256 match
            the commit marker, so those earlier checkpoints are read back. Damaged ones are
            not counted and are deleted with a warning naming them: they can never be
            loaded. If one cannot be read (an I/O error), this save deletes nothing, since it
            might be intact; the next save tries again.
        storage_options: fsspec options for URLs, e.g. ``{"anon": False}`` or
            ``{"client_kwargs": {"endpoint_url": url}}``; ignored for local paths.
        take_over: allow this run to take the directory over from a run that claimed it
            before this process started (e.g. continuing the checkpoints of a run that ended).
        shared: a local ``directory`` is one file system mounted on every host (NFS,
            ``/dbfs``). Without it a local path is refused when the ranks run on more than
            one host, since each host would see a different directory. With it, that is
            checked once per run: rank 0 writes a marker file there (in
            ``.sparktrain-shared/``) and every rank on another host must see it within the
            run's ``start_timeout``, else ConfigurationError names the hosts.
        loader: the data loader (``make_torch_dataloader``) or
            :class:`~sparktrain.data.ResumableDistributedSampler`, or its ``state_dict()``:
            the states of all ranks are joined into the epoch's place, saved as
            ``state["loader"]`` (``state`` must be a dict), which ``load_state_dict`` of a
            later run takes up at any number of ranks. Every rank must then call ``save``
            at the same step, and rank 0 waits for the others' states.
        sharded: every rank writes its own part of ``state`` through
            ``torch.distributed.checkpoint`` (DCP), in parallel, e.g. the FSDP model's and
            optimizer's sharded state dicts from
            ``torch.distributed.checkpoint.state_dict.get_state_dict``. Every rank must
            call ``save`` with the same step, after ``dist.init_process_group``. The
            checkpoint is a folder that counts once every rank's files and DCP's metadata
            are in and rank 0 has written the commit marker, which records each file's
            size and SHA-256. Load it with ``load_latest(directory, into=state)``, at this
            or another number of ranks. With ``loader=``, the joined loader state is saved
            beside the shards (``loader.json``, in the marker with its SHA-256), and
            ``load_latest`` puts it in ``into["loader"]``.

        asynchronous: return a :class:`PendingSave` (on every rank) once the state is staged
            in host memory (CUDA: pinned), and write it, whole or sharded, in the background,
            committed as above. The next ``save``, its ``wait()``, :func:`wait` or the end of
            the rank's function waits for it and raises its failure (CheckpointError naming
            the step). Call :func:`wait` before ``destroy_process_group``.

    Returns:
        The path or URL of the checkpoint's data file on rank 0; None on other ranks; with
        ``asynchronous``, a :class:`PendingSave` on every rank.

    Raises:
        ConfigurationError: ``step``, ``keep_last`` or ``directory`` is invalid, fsspec
            is missing for a URL, or ``directory`` is a local path while the ranks run on
            several hosts and ``shared`` is not set (or is set, but another host does not
            see the directory rank 0 sees).
        CheckpointOwnershipError: another live run writes into ``directory``.
        CheckpointError: on a rank other than 0, rank 0 could not save the checkpoint.
        OSError: the storage failed; the previous checkpoint is left as it was.

    Example:
        >>> sparktrain.checkpoint.save({"model": model.state_dict(), "epoch": epoch},
        ...                            "/dbfs/ckpt/run1", step=epoch, keep_last=2)
        '/dbfs/ckpt/run1/step-000000000003.5f0c2a9e1b7d4c3a.pt'
    """
    where = _directory(directory)
    _check_save_args(step, keep_last)
    _background.settle()  # the save still in flight first; its failure is raised here
    if loader is not None:
        _loader.check_state(state)
    store = _Store(where, storage_options)
    check_shared(where, store.root if store.fs is None else None, shared)
    merged = None if loader is None else _loader.gathered(_loader.own_state(loader), where, step)
    if sharded:
        options = dict(storage_options or {})
        args = (state, store, step, keep_last, take_over, options, merged, asynchronous)
        return _sharded.save(*args)
    if loader is not None:
        state = {**state, _loader.KEY: merged}
    write = functools.partial(
        _save, store=store, step=step, keep_last=keep_last, take_over=take_over
    )
    marker = _commit.read_marker(store.read, step)
    return _background.whole(state, where, step, write, asynchronous, marker)


def _save(state: Any, store: _Store, step: int, keep_last: int | None, take_over: bool) -> str:
    """Rank 0's part of :func:`save`: write, commit, prune; the data file's path or URL."""
    import torch

    store.makedirs()
    me = _owner.this_process()
    _owner.claim(store, me, take_over)
    data = layout.data_name(step, uuid.uuid4().hex[:16])
    writers: list[_HashingWriter] = []

    def fill(f: IO[bytes]) -> None:
        writers.append(_HashingWriter(f))
        torch.save(state, writers[0])  # type: ignore[arg-type]

    store.write(data, fill)
    try:
        _owner.recheck(store, me)  # a takeover during a long upload must not be committed over
    except CheckpointOwnershipError:
        store.remove(data)
        raise
    marker = {
        "format": _FORMAT,
        "step": step,
        "data": data,
        "size": writers[0].size,
        "sha256": writers[0].sha256.hexdigest(),
        "run_id": me["run_id"],
        "attempt": context.attempt(),
        "time": time.time(),
    }
    store.write(marker_name(step), lambda f: f.write(json.dumps(marker).encode()))
    tidy(store, step, data, keep_last)
    return store.url(data)


def load_latest(
    directory: str | os.PathLike[str],
    map_location: Any = None,
    *,
    weights_only: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    shared: bool = False,
    into: Any = None,
) -> Checkpoint | None:
    """Load the newest committed checkpoint of ``directory``, or None when there is none.

    Checkpoints that are uncommitted, or whose data is missing, truncated or corrupted
    (size or SHA-256 differs from its commit marker), are skipped with a
    :class:`CheckpointWarning` naming the path and the reason, and the next newest is tried.
    Any rank may call it; it only reads.

    Args:
        directory: a local path, ``file://`` URL or any fsspec URL.
        map_location: passed to ``torch.load``, e.g. ``"cpu"`` or ``{"cuda:0": "cuda:1"}``.
        weights_only: passed to ``torch.load``; False allows arbitrary pickled objects and
            must only be used for checkpoints you trust.
        storage_options: fsspec options for URLs; ignored for local paths.
        shared: a local ``directory`` is mounted on every host (see :func:`save`).
        into: load a sharded checkpoint (``save(..., sharded=True)``) into this state, in
            place, through ``torch.distributed.checkpoint``: every rank calls it with its
            own state of the same shape as the saved one (e.g. ``get_state_dict(model,
            optimizer)`` of an FSDP model), at any number of ranks; rank 0 picks the
            checkpoint. Then put it back, e.g. with ``set_state_dict``. A checkpoint saved
            with ``loader=`` also sets ``into["loader"]``, the loader's state (into must be
            a dict), for ``load_state_dict`` at any number of ranks.

    Returns:
        ``Checkpoint(step, state, path)``, or None when no usable checkpoint exists; with
        ``into``, ``state`` is ``into``, loaded.

    Raises:
        ConfigurationError: ``directory`` is invalid, fsspec is missing for a URL, or
            ``directory`` is a local path while the ranks run on several hosts and
            ``shared`` is not set.
        CheckpointError: the newest intact checkpoint cannot be loaded by ``torch.load``
            (e.g. ``weights_only`` or ``map_location`` does not fit it); older ones are not
            tried, since they would almost surely fail the same way.
        ConfigurationError: the newest intact checkpoint is sharded and ``into`` is not
            given, or it is whole and ``into`` is given (the message says how to load it).

    Example:
        >>> ckpt = sparktrain.checkpoint.load_latest("s3://bucket/run1", map_location="cpu")
        >>> if ckpt is not None:
        ...     model.load_state_dict(ckpt.state["model"])
        ...     start = ckpt.step + 1
    """
    where = _directory(directory)
    store = _Store(where, storage_options)
    check_shared(where, store.root if store.fs is None else None, shared)
    if into is None:
        return _pick(store, lambda data: _load(store, data, map_location, weights_only))

    def pick() -> tuple[int, str] | None:
        found = _pick(store, lambda data: _sharded_only(store, data))
        return None if found is None else (found.step, found.state)

    options = dict(storage_options or {})
    picked = _sharded.load_into(store, into, options, pick)
    return None if picked is None else Checkpoint(picked[0], into, store.url(picked[1]))


def _sharded_only(store: _Store, data: str) -> str:
    if not layout.is_sharded(data):
        raise ConfigurationError(
            f"the newest checkpoint of {store.where}, {store.url(data)}, is a whole one "
            "(saved without sharded=True): load it with load_latest(directory) and no into="
        )
    return data


def _pick(store: _Store, load: Callable[[str], Any]) -> Checkpoint | None:
    """The newest usable checkpoint, its state being ``load(data name)``; warns of the
    ones skipped (as :func:`load_latest`'s caller)."""
    for _attempt in range(_ATTEMPTS):
        names = store.names()
        found, skipped = _newest(store, names, load)
        if found is not None or not any(exc.vanished for exc in skipped.values()):
            break
    for step, exc in sorted(skipped.items(), reverse=True):
        warn(f"skipping checkpoint {store.url(marker_name(step))}: {exc}")
    newest = -1 if found is None else found.step
    for name in sorted(names):
        data_step = layout.written_step(name)
        if data_step is not None and data_step > newest and data_step not in skipped:
            warn(f"ignoring {store.url(name)}: it has no commit marker (its save was interrupted)")
    return found


def _newest(
    store: _Store, names: list[str], load: Callable[[str], Any]
) -> tuple[Checkpoint | None, dict[int, Unusable]]:
    """The newest usable checkpoint among ``names``, and why each newer one was skipped."""
    skipped: dict[int, Unusable] = {}
    for step, _marker in layout.committed(names):
        try:
            data = verify(store, step)
            state = load(data)
        except Unusable as exc:
            skipped[step] = exc
            if exc.vanished:  # pruned under us: everything older is going too
                return None, skipped
            continue
        return Checkpoint(step, state, store.url(data)), skipped
    return None, skipped


def _load(store: _Store, data: str, map_location: Any, weights_only: bool) -> Any:
    import torch

    if layout.is_sharded(data):
        raise ConfigurationError(
            f"the newest checkpoint of {store.where}, {store.url(data)}, is sharded (saved "
            "with sharded=True): load it on every rank with load_latest(directory, "
            "into=state), state being what was saved, e.g. {'model': ..., 'optim': ...} "
            "from get_state_dict(model, optimizer)"
        )

    try:
        with store.open(data) as f:
            return torch.load(f, map_location=map_location, weights_only=weights_only)
    except FileNotFoundError:
        raise Unusable(f"its data file {store.url(data)} vanished", "vanished") from None
    except Exception as exc:
        hint = ""
        if weights_only and "weights_only" in str(exc):
            hint = "; if it holds other objects than tensors and containers and you trust it, "
            hint += "pass weights_only=False"
        raise CheckpointError(
            f"checkpoint {store.url(data)} is intact (size and SHA-256 match its commit "
            f"marker) but torch.load failed: {type(exc).__name__}: {exc}{hint}"
        ) from exc
