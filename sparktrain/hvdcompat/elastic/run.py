"""``@hvd.elastic.run``: Horovod's elastic loop on sparktrain's restarts and elastic sizes.

Horovod keeps the surviving processes through a failure; sparktrain launches every rank again
(``max_restarts``; an elastic run ``np=(min, max)`` at the size the cluster allows). So the
wrapper, on start, restores the newest commit the run kept on storage (see
:mod:`~sparktrain.hvdcompat.elastic.commits`) on rank 0, calls the reset callbacks when the
state was committed at another size, and syncs every rank to rank 0 (as Horovod does), then
runs the function. In the process it does what Horovod does: a ``HorovodInternalError``
restores the last commit and runs the function again (at most :data:`MAX_RETRIES` times
without a commit between). A ``HostsUpdatedInterrupt`` (a stop sparktrain asked for, seen at
a commit) ends the attempt after that commit: the rank ends as SIGTERM ends it, so the driver
launches the run again (larger, for a grow) and it resumes from that commit.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from sparktrain import contract
from sparktrain.hvdcompat.basics import _checked, rank, size
from sparktrain.hvdcompat.elastic.commits import Commits
from sparktrain.hvdcompat.elastic.state import State
from sparktrain.hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from sparktrain.hvdcompat.functions import broadcast_object
from sparktrain.worker import context

# Retries after a HorovodInternalError with no commit between them, before it is raised.
MAX_RETRIES = 3

R = TypeVar("R")


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Run ``func(state, *args, **kwargs)`` as Horovod's elastic mode does (``hvd.elastic.run``).

    Example:
        >>> @hvd.elastic.run  # doctest: +SKIP
        ... def train(state):
        ...     for state.epoch in range(state.epoch, epochs):
        ...         ...
        ...         state.commit()

    Args:
        func: the training function; its first argument is the :class:`State`.

    Returns:
        The wrapped function; it returns what ``func`` returns.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        if not isinstance(state, State):
            raise TypeError(
                "a function decorated with @hvd.elastic.run takes the state first: "
                f"train(state, ...) with state = hvd.elastic.TorchState(...), not "
                f"{type(state).__name__}"
            )
        _checked()  # hvd.init() first, as in Horovod
        context.should_stop()  # SIGTERM from here on is a request, seen at the next commit
        _resume(state)
        failures = 0
        while True:
            state.sync()
            made = state._commits.made
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                failures = 1 if state._commits.made > made else failures + 1
                if failures > MAX_RETRIES:
                    raise HorovodInternalError(
                        f"hvd.elastic.run: the function raised HorovodInternalError {failures} "
                        f"times with no commit between; giving up after {MAX_RETRIES} "
                        f"retries from the last commit. The last one: {exc}"
                    ) from exc
                if rank() == 0:
                    context.log_to_driver(
                        f"sparktrain: hvd.elastic: {type(exc).__name__}: {exc}; restoring the "
                        f"last commit (retry {failures}/{MAX_RETRIES})"
                    )
                state.restore()
                state.on_reset()
            except HostsUpdatedInterrupt:
                _end_attempt(state)

    return wrapper


def _resume(state: State) -> None:
    """Load the newest kept commit on rank 0 and tell every rank its number; reset the state
    when it was committed at another size."""
    commits = Commits.for_run(kept=type(state)._snapshot is not State._snapshot)
    state._commits = commits
    snapshot = commits.newest()
    found = (-1, 0) if snapshot is None else (snapshot["step"], snapshot["world_size"])
    step, committed_size = broadcast_object(found)
    commits.step = step
    if snapshot is not None:
        state._load_snapshot(snapshot)
        context.log_to_driver(
            f"sparktrain: hvd.elastic: resuming from commit {step} of {commits.directory} "
            f"(made by {committed_size} ranks; now {size()})"
        )
    previous = committed_size or int(os.environ.get(contract.PREVIOUS_WORLD_SIZE_ENV) or size())
    if previous != size():
        state.on_reset()


def _end_attempt(state: State) -> NoReturn:
    """End this rank as the SIGTERM it was asked to stop with would have, after the commit."""
    if rank() == 0:
        kept = (
            f"commit {state._commits.step} is kept in {state._commits.directory}"
            if state._commits.directory
            else "its commits were in memory only"
        )
        context.log_to_driver(
            f"sparktrain: hvd.elastic: the ranks were asked to stop; ending this attempt ({kept})"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    raise HostsUpdatedInterrupt()  # not reached: SIGTERM's default action ends the process
