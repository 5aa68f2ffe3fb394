"""Asynchronous saves: stage the state in host memory, write it in a background thread.

``save(..., asynchronous=True)`` copies the state's tensors to host memory (CUDA tensors into
pinned host memory, one synchronize for all of them), so training may change the tensors at
once, and hands the write to one background thread. The write is the same as a synchronous
save's, commit marker last, so a kill at any instant leaves the previous checkpoint
loadable. A process has at most one save in flight: the next ``save`` (asynchronous or not)
first waits for it, and a failure is raised there, as at :meth:`PendingSave.wait`,
:func:`wait`, or when the rank's function returns (or calls ``sys.exit(0)``) under sparktrain;
a function that raises does not wait, and its write in flight is abandoned, uncommitted.
Outside sparktrain, an ``atexit`` hook waits for the write and prints a failure on stderr. A failure is raised once:
when the user has seen it, it is not raised again.
"""

from __future__ import annotations

import atexit
import copy
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

from sparktrain.checkpoint import _commit
from sparktrain.checkpoint._errors import CheckpointError
from sparktrain.worker import context

_lock = threading.Lock()
_pending: list[PendingSave] = []  # the newest asynchronous save of this process, if any
_hooked: list[bool] = []


class PendingSave:
    """The handle of an asynchronous save, what ``save(..., asynchronous=True)`` returns.

    Attributes:
        step: the checkpoint's step.
        directory: the checkpoint directory, as given to ``save``.
        path: once the save is committed, what a synchronous ``save`` returns: the path or
            URL of the checkpoint's data on rank 0, None on other ranks (and until then).
    """

    def __init__(self, step: int, directory: str) -> None:
        self.step = step
        self.directory = directory
        self.path: str | None = None
        self._error: BaseException | None = None
        self._seen = False
        self._finished = threading.Event()

    def done(self) -> bool:
        """Whether the background write has ended, committed or failed."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> str | None:
        """Wait until the checkpoint is committed (on every rank: as a synchronous ``save``
        returns), and return :attr:`path`.

        Raises:
            TimeoutError: ``timeout`` seconds passed first; the write goes on.
            CheckpointError: the background save failed; its cause is chained and named.
        """
        if not self._finished.wait(timeout):
            raise TimeoutError(
                f"asynchronous checkpoint save of step {self.step} to {self.directory} is "
                f"still writing after {timeout} s"
            )
        error = self.exception()
        if error is not None:
            raise error
        return self.path

    def exception(self) -> CheckpointError | None:
        """The error that ended the save (a CheckpointError naming the step and the cause),
        or None while it runs or once it is committed."""
        if not self._finished.is_set() or self._error is None:
            return None
        self._seen = True
        cause = self._error
        error = CheckpointError(
            f"asynchronous checkpoint save of step {self.step} to {self.directory} failed "
            f"in the background: {describe(cause)}; it was not committed, so "
            "load_latest still finds the checkpoint before it, if any"
        )
        error.__cause__ = cause
        return error

    def _run(self, write: Callable[[], str | None]) -> None:
        try:
            self.path = write()
        except BaseException as exc:  # noqa: BLE001 - every failure is kept for the user
            self._error = exc
        finally:
            self._finished.set()

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self._error else "committed"
        return f"PendingSave(step={self.step}, directory={self.directory!r}, {state})"


def describe(error: BaseException) -> str:
    """``error`` as ``Type: message``. DCP's CheckpointException, whose text holds every failed
    rank's traceback over many lines, is reduced to each rank's own exception, on one line:
    ``OSError: [Errno 28] No space left on device (rank 0)``; ranks that failed alike are
    named together. The exception itself stays chained for the traceback."""
    failures = getattr(error, "failures", None)
    if type(error).__name__ != "CheckpointException" or not isinstance(failures, Mapping):
        return f"{type(error).__name__}: {error}"
    ranks: dict[str, list[str]] = {}
    for rank, failure in sorted(failures.items()):
        cause = failure[0] if isinstance(failure, tuple) and failure else failure
        text = describe(cause) if isinstance(cause, BaseException) else str(cause)
        ranks.setdefault(" ".join(text.splitlines()), []).append(str(rank))
    if not ranks:
        return f"{type(error).__name__}: {error}"
    return "; ".join(
        f"{text} (rank{'s' if len(names) > 1 else ''} {', '.join(names)})"
        for text, names in ranks.items()
    )


def whole(
    state: Any,
    where: str,
    step: int,
    write: Callable[[Any], str],
    asynchronous: bool,
    marker: Callable[[], Any] | None = None,
) -> str | None | PendingSave:
    """A whole checkpoint: rank 0 runs ``write(state)`` and tells the others, which wait for
    its word (as :func:`posted`; ``marker`` reads the commit marker when rank 0 has ended);
    with ``asynchronous``, on a staged copy in the background."""
    if context.rank() != 0:
        if asynchronous:
            return start(step, where, lambda: _commit.wait(where, step, marker))
        _commit.wait(where, step, marker)
        return None
    if asynchronous:
        staged = stage(state)
        return start(step, where, lambda: posted(where, step, lambda: write(staged)))
    return posted(where, step, lambda: write(state))


def posted(where: str, step: int, write: Callable[[], str]) -> str:
    """Rank 0: ``write()``, then tell the other ranks (and the driver) it is committed, or
    tell the other ranks why not."""
    try:
        path = write()
    except BaseException as exc:
        _commit.post(where, step, None, exc)
        raise
    _commit.post(where, step, path)
    context.tell_saved(step)
    return path


def start(step: int, directory: str, write: Callable[[], str | None]) -> PendingSave:
    """Run ``write`` in a background thread (after any save in flight has ended); its handle."""
    settle()
    handle = PendingSave(step, directory)
    thread = threading.Thread(
        target=handle._run, args=(write,), name=f"sparktrain-checkpoint-{step}", daemon=True
    )
    with _lock:
        _pending[:] = [handle]
        if not _hooked:
            atexit.register(_at_exit)
            _hooked.append(True)
    thread.start()
    return handle


def settle(timeout: float | None = None) -> None:
    """Wait for this process's save in flight, if any; raise its failure unless it was seen.

    Raises:
        CheckpointError: the background save failed (the step and the cause named).
        TimeoutError: ``timeout`` seconds passed first.
    """
    with _lock:
        handle = _pending[0] if _pending else None
    if handle is None:
        return
    if not handle._finished.wait(timeout):
        raise TimeoutError(
            f"asynchronous checkpoint save of step {handle.step} to {handle.directory} is "
            f"still writing after {timeout} s"
        )
    with _lock:
        if _pending and _pending[0] is handle:
            _pending.clear()
    if not handle._seen:
        error = handle.exception()
        if error is not None:
            raise error


def wait(timeout: float | None = None) -> None:
    """Wait for this process's asynchronous checkpoint save, if one is in flight.

    Call it before the process group is destroyed, or where a run ends outside sparktrain
    (under sparktrain, the rank's function returning waits for it).

    Raises:
        CheckpointError: the background save failed (the step and the cause named), unless
            that was already raised.
        TimeoutError: ``timeout`` seconds passed first; the write goes on.
    """
    settle(timeout)


def finish() -> None:
    """At the end of the rank's function (sparktrain's worker calls it): :func:`settle`."""
    settle()


def _at_exit() -> None:
    try:
        settle()
    except CheckpointError as exc:
        print(f"sparktrain: {exc}", file=sys.stderr)


def stage(state: Any) -> Any:
    """A copy of ``state`` whose tensors live in host memory apart from the originals: CUDA
    tensors are copied into pinned host memory (then one synchronize), CPU tensors are
    cloned, DTensors keep their mesh and placements around a staged local tensor
    (ShardedTensors, FSDP1's, are copied by torch, unpinned); other values are deep-copied.
    The same tensor object twice stays one object."""
    import torch

    copied = _stage(state, {})
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the non-blocking copies into pinned memory are done
    return copied


def _stage(value: Any, memo: dict[int, Any]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        key = id(value)
        if key not in memo:
            memo[key] = _stage_tensor(value)
        return memo[key]
    if isinstance(value, Mapping):
        items = [(k, _stage(v, memo)) for k, v in value.items()]
        try:
            return cast(Any, type(value))(items)
        except TypeError:
            return dict(items)
    if isinstance(value, list):
        return [_stage(v, memo) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_stage(v, memo) for v in value)
    return copy.deepcopy(value)


def _stage_tensor(tensor: Any) -> Any:
    import torch

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without DTensor
        DTensor = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(tensor, DTensor):
        local = _stage_tensor(tensor.to_local())
        try:  # the same spec around the host copy (from_local would move it back to the GPU)
            return DTensor(local, tensor._spec, requires_grad=False)
        except (TypeError, AttributeError):  # a torch whose DTensor is built otherwise
            return DTensor.from_local(
                local,
                tensor.device_mesh,
                tensor.placements,
                run_check=False,
                shape=tensor.shape,
                stride=tensor.stride(),
            )
    if type(tensor).__name__ == "ShardedTensor":  # FSDP1's sharded state: torch's own copy
        if tensor.device.type == "cpu":
            return copy.deepcopy(tensor)
        return tensor.to(device="cpu")
    source = tensor.detach()
    if source.is_cuda:
        host = torch.empty(source.shape, dtype=source.dtype, layout=source.layout, pin_memory=True)
        return host.copy_(source, non_blocking=True)
    if type(source) is not torch.Tensor:  # another tensor subclass: its own deepcopy
        return copy.deepcopy(source)
    return source.clone()
