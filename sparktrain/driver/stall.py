"""The stall watch: a run whose ranks have all been silent for ``stall_timeout`` is stalled.

Silent means no line of output (or, when output is not forwarded, no word from a task that
its ranks print), no ``log_to_driver`` message and no ``report`` reached the driver. On a
stall the monitor asks every task where its ranks are (``show_stacks``) and shows each
rank's stack as it comes, once per stall; with ``stall_action="fail"`` it stops the run
instead, and the stacks come with the error.
"""

from __future__ import annotations

from sparktrain.config import RunConfig, conf_key
from sparktrain.errors import RunStalledError
from sparktrain.units import format_duration


class StallWatch:
    """When the run's ranks have been silent for ``config.stall_timeout``.

    The watch starts once the ranks may run (every task arrived); every sign of life moves
    the deadline; once a stall is seen, the next one is counted from the next sign of life.

    Args:
        config: the run's settings.
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.timeout = config.stall_timeout
        self._since: float | None = None
        self._seen = False

    def start(self, now: float) -> None:
        """The ranks may run from ``now``."""
        self._since = now

    def activity(self, now: float) -> None:
        """A rank showed a sign of life at ``now``."""
        if self._since is not None:
            self._since = now
            self._seen = False

    def deadline(self) -> float | None:
        """When the run will count as stalled (``time.monotonic()``), or None for never."""
        if self.timeout is None or self._since is None or self._seen:
            return None
        return self._since + self.timeout

    def stalled(self, now: float) -> bool:
        """Whether the run has stalled by ``now`` (each stall answers True once)."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return False
        self._seen = True
        return True

    def description(self) -> str:
        """What happened, naming the settings."""
        return (
            f"no rank has printed or reported anything for {format_duration(self.timeout or 0)} "
            f"(stall_timeout, {conf_key('stall_timeout')})"
        )

    def error(self) -> RunStalledError:
        """The error that ends a stalled run (``stall_action="fail"``)."""
        return RunStalledError(
            f"{self.description()} and stall_action is 'fail': every rank was stopped.\n"
            "If the function is silent that long on purpose, raise stall_timeout, or call "
            "sparktrain.report() now and then."
        )
