"""Sharded checkpoints: every rank writes its own shards through ``torch.distributed.checkpoint``.

A sharded save's data is a folder, ``step-<step>.<token>.dcp/``, that DCP fills: each rank's
``__<rank>_<n>.distcp`` files and the ``.metadata`` that rank 0 writes once all are in. The
folder has a fresh name per save, like a whole checkpoint's data file. With ``loader=``, rank 0
also writes the loader's state, the states of all ranks joined (:mod:`._loader`), as
``loader.json`` into the folder once DCP is done. The folder counts only once
rank 0 has written its commit marker, which lists every file in it with its size and SHA-256
(each rank hashes its own files, so no rank reads the others' shards). A kill at any instant
before the marker leaves an unreferenced folder, which ``load_latest`` ignores and the next
save deletes; the previous checkpoint stays loadable.

Loading goes the same way back: rank 0 picks the newest intact checkpoint (as ``load_latest``
does for whole ones), tells every rank, and DCP loads it into the state each rank holds, at
any number of ranks (DCP reshards). Rank 0 reads the ``loader.json`` of the checkpoint it
picked (checked against the marker like every file) and sends it with its word, and every rank
puts it under the state's ``"loader"`` key, where a whole checkpoint has it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from sparktrain.checkpoint import _background, _commit, _owner, layout
from sparktrain.checkpoint._errors import CheckpointError, CheckpointOwnershipError
from sparktrain.checkpoint._retention import tidy
from sparktrain.checkpoint._store import _Store
from sparktrain.errors import ConfigurationError
from sparktrain.worker import context

_CHUNK = 1 << 20
METADATA = ".metadata"
LOADER = "loader.json"  # the loader's joined state, rank 0's, beside DCP's files


def _group() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` without one.

    Raises:
        ConfigurationError: the run has several ranks but no process group.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if context.world_size() > 1:
        raise ConfigurationError(
            "sharded checkpoints are written and read by every rank together through "
            "torch.distributed: call dist.init_process_group(...) on every rank first"
        )
    return 0, 1


@contextlib.contextmanager
def _quiet(world: int) -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process; that is meant here."""
    with warnings.catch_warnings():
        if world == 1:
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _share(word: dict[str, Any], world: int) -> dict[str, Any]:
    """Rank 0's ``word``, on every rank."""
    if world == 1:
        return word
    import torch.distributed as dist

    box = [word]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _raise(word: dict[str, Any], what: str = "") -> None:
    """On every rank: raise the error rank 0 met, in its type (or CheckpointError)."""
    if "error" not in word:
        return
    kinds = {k.__name__: k for k in (ConfigurationError, CheckpointOwnershipError)}
    kind = kinds.get(word.get("kind", ""), CheckpointError)
    raise kind(f"{what}: {word['error']}" if what else word["error"])


def _writer(store: _Store, data: str, storage_options: dict[str, Any]) -> Any:
    if store.fs is None:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(store.sub(data).root, sync_files=True)
    return _fsspec("FsspecWriter")(store.url(data), sync_files=True, **storage_options)


def _reader(store: _Store, data: str, storage_options: dict[str, Any]) -> Any:
    if store.fs is None:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(store.sub(data).root)
    return _fsspec("FsspecReader")(store.url(data), **storage_options)


def _planner() -> Any:
    """DCP's load planner, less its guess that a key this rank lacks means a checkpoint of
    torch 2.3 or older: under FSDP a rank that holds no shard of a tensor lacks its key, and
    the guess then re-keys the state the old way and fails the load (``Missing key in
    checkpoint state_dict: optim.param_groups``), e.g. loading 4 ranks' FSDP state at 3."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.default_planner import create_default_local_load_plan

    class Planner(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            if self.metadata is None:
                return super().create_local_plan()
            return create_default_local_load_plan(
                self.state_dict, self.metadata, not self.allow_partial_load
            )

    return Planner()


def _fsspec(name: str) -> Any:
    try:
        from torch.distributed.checkpoint import _fsspec_filesystem
    except ImportError as exc:
        raise ConfigurationError(
            "sharded checkpoints on an fsspec URL need torch.distributed.checkpoint's fsspec "
            f"storage, which this torch lacks ({exc}); use a local or shared path "
            "(e.g. /dbfs/...) or save without sharded=True"
        ) from exc
    return getattr(_fsspec_filesystem, name)


def _own_files(folder: _Store, rank: int) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of the files this rank wrote into ``folder`` (rank 0: with DCP's
    ``.metadata``)."""
    mine = f"__{rank}_"
    files: dict[str, dict[str, Any]] = {}
    for name in sorted(folder.names()):
        if name.startswith(mine) or (rank == 0 and name in (METADATA, LOADER)):
            sha256 = hashlib.sha256()
            with folder.open(name) as f:
                while chunk := f.read(_CHUNK):
                    sha256.update(chunk)
            files[name] = {"size": folder.size(name), "sha256": sha256.hexdigest()}
    return files


def _start(store: _Store, step: int, take_over: bool, world: int) -> dict[str, Any]:
    """Rank 0: claim the directory and name the new checkpoint's folder; tell every rank.

    Raises:
        Exception: what rank 0 met (the other ranks are told first).
    """
    try:
        store.makedirs()
        _owner.claim(store, _owner.this_process(), take_over)
    except Exception as exc:
        _share({"error": str(exc), "kind": type(exc).__name__}, world)
        raise
    return _share({"data": layout.data_name(step, uuid.uuid4().hex[:16], sharded=True)}, world)


def save(
    state: Any,
    store: _Store,
    step: int,
    keep_last: int | None,
    take_over: bool,
    storage_options: dict[str, Any],
    loader: dict[str, Any] | None = None,
    asynchronous: bool = False,
) -> str | None | _background.PendingSave:
    """Every rank: write this rank's shards of ``state``; rank 0 commits once all are in.

    With ``asynchronous``, the state is staged in host memory and written in the background
    (:mod:`._background`), over a gloo group of its own so that its collectives never meet
    the training's; the handle is returned at once.

    ``loader`` is the loader's joined state on rank 0 (None elsewhere, or without one), written
    as ``loader.json`` beside DCP's files.

    Returns:
        The checkpoint folder's path or URL on rank 0; None on the other ranks; with
        ``asynchronous``, the save's handle on every rank.
    """
    rank, world = _group()
    word = _start(store, step, take_over, world) if rank == 0 else _share({}, world)
    _raise(word, f"rank 0 could not start sharded checkpoint {step} of {store.where}")
    data = word["data"]
    if asynchronous:
        group, staged = _background_group(world), _background.stage(state)

        def write() -> str | None:
            args = (staged, store, step, keep_last, storage_options, loader, rank, world, data)
            return _write(*args, group=group)

        return _background.start(step, store.where, write)
    return _write(state, store, step, keep_last, storage_options, loader, rank, world, data)


def _background_group(world: int) -> Any:
    """A gloo group of every rank for background saves (made once: every rank calls it at
    the same save); None with one process."""
    if world == 1:
        return None
    import torch.distributed as dist

    world_group = dist.group.WORLD
    if _groups.get("world") is not world_group:
        _groups["world"], _groups["gloo"] = world_group, dist.new_group(backend="gloo")
    return _groups["gloo"]


_groups: dict[str, Any] = {}


def _write(
    state: Any,
    store: _Store,
    step: int,
    keep_last: int | None,
    storage_options: dict[str, Any],
    loader: dict[str, Any] | None,
    rank: int,
    world: int,
    data: str,
    group: Any = None,
) -> str | None:
    """Every rank: write ``state``'s shards into the folder ``data``; rank 0 commits."""
    import torch.distributed.checkpoint as dcp

    with _quiet(world):
        writer = _writer(store, data, storage_options)
        dcp.save(state, storage_writer=writer, process_group=group)
    try:
        if loader is not None:
            text = json.dumps(loader).encode()
            store.sub(data).write(LOADER, lambda f: f.write(text))
        files: dict[str, Any] = _own_files(store.sub(data), rank)
    except OSError as exc:
        files = {"error": f"rank {rank} could not write or read back its files: {exc}"}
    everyone = [files]
    if world > 1:
        import torch.distributed as dist

        everyone = [{} for _ in range(world)]
        dist.all_gather_object(everyone, files, group=group)
    if rank != 0:
        _commit.wait(store.where, step, _commit.read_marker(store.read, step))
        return None
    try:
        path = _commit_sharded(store, step, data, everyone, keep_last)
    except BaseException as exc:
        _commit.post(store.where, step, None, exc)
        raise
    _commit.post(store.where, step, path)
    context.tell_saved(step)
    return path


def _commit_sharded(
    store: _Store, step: int, data: str, everyone: list[dict[str, Any]], keep_last: int | None
) -> str:
    """Rank 0: write the commit marker of the folder ``data`` once every rank's files are in."""
    files: dict[str, Any] = {}
    for part in everyone:
        if "error" in part:
            raise CheckpointError(f"sharded checkpoint {step} of {store.where}: {part['error']}")
        files.update(part)
    if METADATA not in files:
        raise CheckpointError(
            f"sharded checkpoint {step} of {store.where}: torch.distributed.checkpoint wrote "
            f"no {METADATA} into {store.url(data)}"
        )
    me = _owner.this_process()
    _owner.recheck(store, me)  # a takeover during a long write must not be committed over
    marker = {
        "format": 1,
        "step": step,
        "data": data,
        "sharded": True,
        "size": sum(entry["size"] for entry in files.values()),
        "sha256": "",
        "files": files,
        "run_id": me["run_id"],
        "attempt": context.attempt(),
        "time": time.time(),
    }
    store.write(layout.marker_name(step), lambda f: f.write(json.dumps(marker).encode()))
    tidy(store, step, data, keep_last)
    return store.url(data)


def load_into(
    store: _Store,
    into: Any,
    storage_options: dict[str, Any],
    pick: Callable[[], tuple[int, str] | None],
) -> tuple[int, str] | None:
    """Every rank: load the checkpoint rank 0 ``pick``\\ s into ``into``, in place.

    Returns:
        ``(step, data folder's name)``, or None when there is no checkpoint.
    """
    import torch.distributed.checkpoint as dcp

    rank, world = _group()
    word: dict[str, Any] = {}
    if rank == 0:
        try:
            found = pick()
            word = {"none": True} if found is None else _word(store, *found)
        except (ConfigurationError, CheckpointError) as exc:
            word = {"error": str(exc), "kind": type(exc).__name__}
            _share(word, world)
            raise
    word = _share(word, world)
    _raise(word)
    if "none" in word:
        return None
    reader = _reader(store, word["data"], storage_options)
    if "loader" in word and not isinstance(into, dict):
        raise ConfigurationError(
            f"sharded checkpoint {word['step']} of {store.where} holds the loader's state, "
            f"which load_latest puts under into[{'loader'!r}]: pass a dict as into="
        )
    if "loader" not in word and isinstance(into, dict) and "loader" in into:
        raise ConfigurationError(
            f"sharded checkpoint {word['step']} of {store.where} was saved without loader=, "
            f"so it holds no loader state for into[{'loader'!r}]: leave that key out of "
            "into= (the loader starts its epoch afresh), or save with loader=loader"
        )
    # DCP loads every key of its state; the loader's is not among DCP's, so it is left out
    # (a dict of the same entries, into which DCP also puts the values it replaces).
    state = {k: v for k, v in into.items() if k != "loader"} if "loader" in word else into
    with _quiet(world):
        dcp.load(state, storage_reader=reader, planner=_planner())
    if "loader" in word:
        into.update(state)
        into["loader"] = word["loader"]
    return word["step"], word["data"]


def _word(store: _Store, step: int, data: str) -> dict[str, Any]:
    """Rank 0's word on the checkpoint it picked: its step, folder and loader's state, if any.

    Raises:
        CheckpointError: its ``loader.json`` (intact: checked against the marker) is not JSON.
    """
    word: dict[str, Any] = {"step": step, "data": data}
    folder = store.sub(data)
    if LOADER in folder.names():
        try:
            word["loader"] = json.loads(folder.read(LOADER))
        except ValueError as exc:
            raise CheckpointError(
                f"sharded checkpoint {step}: {store.url(data)}/{LOADER} is not JSON ({exc})"
            ) from exc
    return word
