"""The restart policy of a run: which failures launch it again, and how many times."""

from __future__ import annotations

from sparktrain.config import RunConfig
from sparktrain.errors import RendezvousTimeoutError, RunStalledError, WorkerFailedError
from sparktrain.log import get_logger

_log = get_logger(__name__)


def restartable(error: BaseException, config: RunConfig) -> bool:
    """Whether launching again can help: lost ranks and stalls yes; the user's own exception
    only on request (it would most likely fail again); unloadable functions and results never."""
    if isinstance(error, (RendezvousTimeoutError, RunStalledError)):
        return True
    if not isinstance(error, WorkerFailedError):
        return False
    root = error.root_cause
    if root.phase in ("load", "result"):
        return False
    if root.user_error:
        return config.restart_on_user_error
    return True


def first_line(error: BaseException) -> str:
    """What a failure is called in the run's record and log: its root cause's first line."""
    if isinstance(error, WorkerFailedError):
        return error.root_cause.describe().splitlines()[0]
    lines = str(error).splitlines()
    return lines[0] if lines else ""


class RestartPolicy:
    """Counts a run's restarts after failures (resizes are not restarts) against
    ``max_restarts``, and says which failures may be restarted.

    Args:
        config: the run's settings (``max_restarts``, ``restart_on_user_error``).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.restarts = 0

    def restart(self, error: BaseException) -> str | None:
        """Whether the run is launched again after ``error``: the reason the next attempt's
        size is chosen, logged with the attempt it starts; None if it is not."""
        most = self.config.max_restarts
        if self.restarts >= most or not restartable(error, self.config):
            return None
        self.restarts += 1
        cause, total = first_line(error), most + 1
        _log.warning(
            "attempt %d/%d failed: %s; starting attempt %d/%d",
            self.restarts,
            total,
            cause,
            self.restarts + 1,
            total,
        )
        return (
            f"restart {self.restarts}/{most} after: {cause}; the largest size that fits now, "
            "without waiting for what was lost"
        )
