"""What a task is handed: the run's settings, its channel and key, and the pickled function."""

from __future__ import annotations

import dataclasses
from typing import Any

from sparktrain.config import RunConfig


@dataclasses.dataclass(frozen=True)
class TaskJob:
    """Everything a task needs, shipped inside the Spark closure (or handed over locally).

    Attributes:
        run_id: identifies the run (and names its processes' environment).
        attempt: 0 for the first launch, then one more per restart.
        config: the run's settings, as RunConfig.to_json().
        channel: ``host:port`` of the driver's channel.
        key: the run's HMAC key.
        payload: the pickled function and arguments.
        hook: private test hook, a pickled callable run with the task index before rendezvous.
        ranks_per_task: how many ranks each Spark task runs, one per GPU it holds
            (``spark.task.resource.gpu.amount``); the stage has ``np / ranks_per_task`` tasks.
        all_ranks: every rank's value comes back (``run_all``), not rank 0's alone.
        previous_world_size: an elastic run's size in the previous attempt (its own size on
            the first); 0 for a run of fixed size.
        client_versions: set on a Spark Connect session's first stage (until one has checked
            them): the client's Python and package versions, which each task compares with
            its own, and a task that cannot reach the channel then says so rather than waiting
            (see :mod:`sparktrain.driver.connect_check`).
        stream_window: for a run given a DataFrame (``sparktrain.data.from_dataframe``), the
            batches each rank may hold unread; the stage's input is then the DataFrame's
            partitions, which each task streams to its ranks. 0: no DataFrame.
        stream_rows: the rows of a batch on the ranks: a task that feeds several ranks deals
            its input out in pieces of at most this many rows, so their shares stay even.
        run_config: ``config`` as a :class:`RunConfig`, built once when the job is made and
            once where it is unpickled.
    """

    run_id: str
    attempt: int
    config: dict[str, Any]
    channel: str
    key: bytes
    payload: bytes
    hook: bytes | None = None
    ranks_per_task: int = 1
    all_ranks: bool = False
    previous_world_size: int = 0
    client_versions: dict[str, str] | None = None
    stream_window: int = 0
    stream_rows: int = 0
    # ``config`` as a RunConfig, built once on each side: where the job is made, and where it
    # is unpickled (only ``config`` crosses; see __getstate__).
    run_config: RunConfig = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_config", RunConfig.from_json(self.config))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["run_config"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def tasks(self) -> int:
        """How many Spark tasks the run's stage has."""
        return self.run_config.world_size // self.ranks_per_task
