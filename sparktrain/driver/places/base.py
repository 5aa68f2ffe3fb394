"""What a run asks of the place it goes to, with the answers of a place that has nothing to do
(no conf, no slots to count, no first-stage checks)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparktrain.config import RunConfig

if TYPE_CHECKING:
    from sparktrain.driver.elastic import ResizeStop
    from sparktrain.driver.launch import Launch
    from sparktrain.task.assignment import TaskJob


@dataclasses.dataclass(frozen=True)
class Turn:
    """How a place's runs take turns for task slots with the other runs of this process.

    Attributes:
        application: the name of the slots its runs share (a Spark application, a Connect
            server).
        total: the slots there now.
        most: the most there could ever be, where the settings say (None: unbounded).
    """

    application: str
    total: Callable[[], int]
    most: int | None


class Place:
    """Where a run goes. Each method is a question the runner or the attempts loop asks."""

    #: what the place is called in messages ("the driver", "classic", "Spark Connect")
    kind = "the driver"
    #: the SparkSession the run's stage runs on (None on the driver)
    session: Any = None

    def conf(self) -> Any:
        """The conf one call reads (``get(key, default)``), or None without a session."""
        return None

    def spark_settings(self, conf: Any) -> dict[str, str] | None:
        """The ``spark.sparktrain.*`` entries of ``conf`` (None: the place has no conf)."""
        return None

    def check(self, config: RunConfig, conf: Any) -> int:
        """The place's checks of a run that cost nothing; returns the ranks per task."""
        return 1

    def check_frame(self, frame: Any) -> None:
        """Refuse a DataFrame this place's stage cannot run over."""

    def check_own_partitions(self, frame: Any, tasks: int) -> None:
        """Refuse a stage over ``frame``'s own partitions (``repartition=False``) that cannot
        give each of its ``tasks`` one (the driver's processes: it reads the frame itself)."""

    def prepare(self, config: RunConfig, ranks_per_task: int) -> None:
        """What the place does once a run is checked and pickled, before its first attempt."""

    def turn(self) -> Turn | None:
        """How the run takes its turn for slots (None: it launches at once)."""
        return None

    def size(self, config: RunConfig, job: TaskJob, held: int, since: float | None) -> int | None:
        """The next attempt's size once its slots are free (None: the place does not size or
        wait; the run's np is used)."""
        return None

    def grow_watch(
        self, config: RunConfig, job: TaskJob, held: Callable[[], int]
    ) -> Callable[[int], ResizeStop | None] | None:
        """What an elastic attempt asks at each checkpoint: whether to stop there and grow."""
        return None

    def channel_address(self) -> tuple[str, str]:
        """Where the run's channel listens, and the address tasks use to reach it."""
        return "127.0.0.1", "127.0.0.1"

    def launch(self, job: TaskJob, description: str, frame: Any) -> Launch:
        """Start nothing yet: the launch of ``job``'s tasks (over ``frame``, if given)."""
        raise NotImplementedError

    # What a first stage teaches about a place (Spark Connect: whether the executors reach
    # this client, and have its versions); a place with nothing to learn keeps these.
    @property
    def detached(self) -> bool:
        """Tasks get no channel: they learn the layout from Spark's barrier."""
        return False

    @property
    def checking(self) -> bool:
        """The next stage's tasks check the executors' versions and the way back here."""
        return False

    def passed_checks(self) -> None:
        """A stage passed the checks: the place's runs need not check again."""

    def verdict(self, stage_error: BaseException | None) -> Exception | None:
        """What a failed checking stage means for the place (None: nothing)."""
        return None

    def detach(self, config: RunConfig, why: Exception) -> None:
        """The tasks could not reach this client (``why``): the place's runs go on detached
        from now, or, where that cannot be, this raises."""
        raise why

    # The Spark jobs a run starts besides its stage (the driver reading a DataFrame for ranks
    # on the driver): run in a group of the run's own, which an ended run cancels.
    def open_group(self, group: str, description: str) -> None:
        """Spark jobs this thread starts from now on belong to ``group``."""

    def close_group(self, group: str) -> None:
        """This thread's jobs no longer belong to ``group``."""

    def cancel_group(self, group: str) -> None:
        """Cancel what is left of ``group``'s jobs."""
