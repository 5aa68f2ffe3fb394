"""What user code inside a rank can ask: its place, the backend, and the way to the driver.

Every helper also works outside a run (rank 0 of 1, messages printed locally), so the same
training function runs single-process while it is being written.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from typing import Any

from sparktrain import wire

# Variables the supervisor gives each worker process for its link to the driver.
CHANNEL_ENV = "_SPARKTRAIN_CHANNEL"
KEY_ENV = "_SPARKTRAIN_KEY"
USE_GPU_ENV = "_SPARKTRAIN_USE_GPU"

_client_lock = threading.Lock()
_client_state: dict[str, Any] = {}


def rank() -> int:
    """This process's global rank (0 outside a run)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of ranks in the run (1 outside a run)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """Rank among the processes on this host (0 outside a run)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """Number of ranks on this host (1 outside a run)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def use_gpu() -> bool:
    """Whether this rank is meant to use CUDA: GPUs assigned and CUDA available.

    Example:
        >>> device = "cuda" if sparktrain.use_gpu() else "cpu"
    """
    if os.environ.get(USE_GPU_ENV) == "0":
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
        address = os.environ.get(CHANNEL_ENV)
        key = os.environ.get(KEY_ENV)
        client = None
        if address and key:
            try:
                client = wire.ChannelClient(address, bytes.fromhex(key), timeout=10.0)
            except OSError as exc:
                print(f"sparktrain: cannot reach the driver ({exc}); messages stay local",
                      file=sys.stderr)
        _client_state["client"] = client
        return client


def _send(message: dict[str, Any]) -> bool:
    client = _client()
    if client is None:
        return False
    try:
        client.send(message)
        return True
    except (OSError, wire.FrameError):
        return False


def log_to_driver(message: object) -> None:
    """Show ``message`` on the driver, prefixed with this rank, whatever the log verbosity.

    Outside a run (or if the driver cannot be reached) the message is printed here instead.
    Logging never raises.

    Example:
        >>> sparktrain.log_to_driver(f"epoch {epoch}: loss {loss:.3f}")
    """
    text = str(message)
    if not _send({"type": "user_log", "rank": rank(), "message": text[: wire.MAX_FRAME // 2]}):
        print(text, flush=True)


def report(*, step: int | None = None, epoch: int | None = None, **metrics: float) -> None:
    """Report progress and metrics to the driver, which shows and records them.

    Only rank 0's reports are kept by default; calling it from every rank is harmless.

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
    message = {"type": "report", "rank": rank(), "step": step, "epoch": epoch, "metrics": clean}
    if not _send(message) and rank() == 0:
        print("sparktrain.report " + json.dumps({k: v for k, v in message.items()
                                                  if k not in ("type",)}), flush=True)
