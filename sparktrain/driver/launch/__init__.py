"""The ways a run's tasks are launched, behind one protocol: Spark barrier tasks on a classic
session (``stage``), on a Spark Connect session (``connect``), or the local supervisor on the
driver for ``np < 0`` (``local``). The monitor sees each through :class:`Launch`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sparktrain.wire.address import listen_address

if TYPE_CHECKING:
    from sparktrain.driver.connect_check import ConnectPlan
    from sparktrain.task.assignment import TaskJob


class Launch(Protocol):
    """A started set of tasks: Spark barrier tasks or the local supervisor."""

    def start(
        self, done: Callable[[list[dict[str, Any]] | None, BaseException | None], None]
    ) -> None:
        """Start; call ``done(records, error)`` exactly once, from any thread, when over."""

    def cancel(self) -> None:
        """Forcefully end every task (idempotent)."""

    def describe_error(self, error: BaseException) -> str:
        """A one-line explanation of a launch-level error (e.g. a Spark job failure)."""

    def failed_task(self, error: BaseException) -> Any:
        """The task (``index``, ``host``, ``executor``) a launch-level error names, or None."""


def channel_address(session: Any, connect: ConnectPlan | None = None) -> tuple[str, str]:
    """Where the channel listens and what address tasks use to reach it."""
    if session is None:
        return "127.0.0.1", "127.0.0.1"
    if connect is not None:
        fallback = "::" if ":" in connect.address else "0.0.0.0"
        return listen_address(connect.address, fallback), connect.address
    conf = session.sparkContext.getConf()
    advertise = conf.get("spark.driver.host") or "127.0.0.1"
    # Tasks connect to spark.driver.host, so that address alone is listened on when it is
    # this machine's. It may not be (NAT, a container's published address, a proxy): then
    # the channel listens where Spark's own driver does, which tasks can reach.
    fallback = conf.get("spark.driver.bindAddress") or "0.0.0.0"
    return listen_address(advertise, fallback), advertise


def new_launch(
    session: Any, job: TaskJob, description: str, connect: ConnectPlan | None, frame: Any = None
) -> Launch:
    """The launch of ``job``'s tasks: on the driver without a session, else on Spark; a run
    given a DataFrame (``frame``) runs its stage over it (or, local, reads it here)."""
    if session is None:
        from sparktrain.driver.launch.local import LocalLaunch

        return LocalLaunch(job, frame)
    if connect is not None:
        from sparktrain.driver.launch.connect import ConnectLaunch

        return ConnectLaunch(session, job, description, frame)
    from sparktrain.driver.launch.stage import SparkLaunch

    return SparkLaunch(session, job, description, frame)
