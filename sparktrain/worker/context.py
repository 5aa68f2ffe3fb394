"""What user code inside a rank can ask: its place, the backend, and the way to the driver.

Every helper also works outside a run (rank 0 of 1, messages printed locally), so the same
training function runs single-process while it is being written.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from typing import Any

from sparktrain import contract, wire
from sparktrain.wire import protocol

# Re-exported for code that reads the run id where a rank runs (checkpoint ownership).
RUN_ID_ENV = contract.RUN_ID_ENV
# Seconds to be admitted by the driver's channel when the run does not say (outside a task).
CONNECT_TIMEOUT = 10.0

# Set by the SIGTERM handler that should_stop() installs. Signal handlers need state that
# lives as long as the process; this is the one such piece in a rank.
_stop_requested = threading.Event()
_sigterm_armed: list[bool] = []

_client_lock = threading.Lock()
_client_state: dict[str, Any] = {}


def rank() -> int:
    """This process's global rank (0 outside a run)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of ranks in the run (1 outside a run)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """Rank among the processes of this node (0 outside a run): the host's, or the Spark
    task's where every task is a node (the ``node`` setting)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """Number of ranks of this node (1 outside a run; see :func:`local_rank`)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def attempt() -> int:
    """Which launch of the run this is: 0 first, then 1, 2, … after restarts (``max_restarts``).

    It is read from ``SPARKTRAIN_ATTEMPT``, which counts from 0. What the user reads counts
    from 1 (the driver's "attempt 2/3", the log folder ``attempt-2``, a kept result's
    ``attempt2``): say ``sparktrain.attempt() + 1`` in messages, so they agree.

    Example:
        >>> if sparktrain.attempt() > 0:
        ...     print(f"attempt {sparktrain.attempt() + 1}: resuming after a restart")
    """
    return int(os.environ.get(contract.ATTEMPT_ENV, "0"))


def should_stop() -> bool:
    """True once this rank has been asked to stop (preemption, cancellation, a failed peer).

    The first call arms a grace period: from then on SIGTERM sets this flag instead of ending
    the process at once, and the rank has the run's ``grace_period`` to save a checkpoint and
    return before it is killed. Ranks that never call it end at once on SIGTERM, so a rank
    blocked in a collective does not hold up the others. Call it from the main thread (where
    Python runs signal handlers), e.g. once per step.

    Example:
        >>> for step, batch in enumerate(loader):
        ...     if sparktrain.should_stop():
        ...         checkpoint.save(state, ckpt_dir, step)
        ...         break
    """
    if not _sigterm_armed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: _stop_requested.set())
        _sigterm_armed.append(True)
    return _stop_requested.is_set()


def tell_saved(step: int) -> None:
    """Tell the driver this rank committed checkpoint ``step`` (nothing outside a run): an
    elastic run below its max may stop there to grow (see ``resize_interval``)."""
    _send(protocol.SAVED(rank=rank(), step=int(step)))


def use_gpu() -> bool:
    """Whether this rank is meant to use CUDA: GPUs assigned and CUDA available.

    Example:
        >>> device = "cuda" if sparktrain.use_gpu() else "cpu"
    """
    if os.environ.get(contract.USE_GPU_ENV) == "0":
        return False
    import torch

    return bool(torch.cuda.is_available())


def default_backend() -> str:
    """``"nccl"`` where this rank has a CUDA device to use, else ``"gloo"``.

    Example:
        >>> import torch.distributed as dist
        >>> dist.init_process_group(sparktrain.default_backend())
    """
    return "nccl" if use_gpu() else "gloo"


def _client() -> wire.ChannelClient | None:
    """The worker's lazily opened connection to the driver, or None outside a run."""
    with _client_lock:
        if "client" in _client_state:
            client: wire.ChannelClient | None = _client_state["client"]
            return client
        address = os.environ.get(contract.CHANNEL_ENV)
        key = os.environ.get(contract.KEY_ENV)
        client = None
        if address and key:
            try:
                # Admitted within the run's start timeout, as its task was (a flood of
                # strangers' connections may make it try a few times).
                timeout = float(os.environ.get(contract.START_TIMEOUT_ENV) or CONNECT_TIMEOUT)
                client = wire.ChannelClient(address, bytes.fromhex(key), timeout=timeout)
            except OSError as exc:
                print(
                    f"sparktrain: cannot reach the driver ({exc}); messages stay local",
                    file=sys.stderr,
                )
        _client_state["client"] = client
        return client


def _send(message: dict[str, Any]) -> bool:
    client = _client()
    if client is None:
        return False
    try:
        client.send(message)
        return True
    except (OSError, ValueError, TypeError, wire.FrameError):
        return False


def log_to_driver(message: object) -> None:
    """Show ``message`` on the driver, prefixed with this rank, whatever the log verbosity.

    Outside a run (or if the driver cannot be reached) the message is printed here instead.
    Logging never raises.

    Example:
        >>> sparktrain.log_to_driver(f"epoch {epoch}: loss {loss:.3f}")
    """
    text = str(message)
    if not tell_driver(text):
        print(text, flush=True)


def tell_driver(text: str) -> bool:
    """Send ``text`` to the driver as :func:`log_to_driver` does; False outside a run (or
    when the driver cannot be reached), where nothing is printed."""
    return _send(protocol.USER_LOG(rank=rank(), message=text[: wire.MAX_FRAME // 2]))


def _as_int(value: object) -> int | None:
    """``step`` / ``epoch`` as a plain int (numpy and torch scalars included), else None."""
    try:
        return None if value is None else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def report(*, step: int | None = None, epoch: int | None = None, **metrics: float) -> None:
    """Report progress and metrics to the driver, which shows and records them.

    Every rank may call it: the driver's progress bar and MLflow follow rank 0's reports, and
    ``runner.history`` keeps every rank's.

    Args:
        step: optimizer step or batch index, if known.
        epoch: epoch number, if known.
        **metrics: numbers such as ``loss=0.31, accuracy=0.92``.

    Example:
        >>> sparktrain.report(epoch=epoch, loss=loss.item(), accuracy=acc)
    """
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            clean[name] = number
    message = protocol.REPORT(rank=rank(), step=_as_int(step), epoch=_as_int(epoch), metrics=clean)
    if not _send(message) and rank() == 0:
        print(
            "sparktrain.report "
            + json.dumps({k: v for k, v in message.items() if k not in ("type",)}),
            flush=True,
        )
