"""A classic SparkSession: a SparkContext to count slots with, job groups, broadcasts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparktrain.config import RunConfig
from sparktrain.driver.places.base import Turn
from sparktrain.driver.places.session import SessionPlace
from sparktrain.wire.address import listen_address

if TYPE_CHECKING:
    from sparktrain.driver.elastic import ResizeStop
    from sparktrain.driver.launch import Launch
    from sparktrain.task.assignment import TaskJob


class ClassicPlace(SessionPlace):
    """Ranks run in barrier tasks of a classic session's SparkContext."""

    kind = "classic"

    def conf(self) -> Any:
        return self.session.sparkContext.getConf()

    def spark_settings(self, conf: Any) -> dict[str, str]:
        return {k: v for k, v in conf.getAll() if k.startswith("spark.sparktrain.")}

    def partitions(self, frame: Any) -> int:
        # The plan's partitions, planned on the JVM side: no job runs.
        return int(frame._jdf.rdd().getNumPartitions())

    def prepare(self, config: RunConfig, ranks_per_task: int) -> None:
        from sparktrain.driver.handle import stop_spark_at_exit
        from sparktrain.driver.progress import quiet_spark_console
        from sparktrain.shipping.python_probe import check_executor_python

        sc = self.session.sparkContext
        # After the checks that cost nothing: this one may run a one-task Spark job.
        check_executor_python(sc, config.start_timeout)
        stop_spark_at_exit(sc)
        quiet_spark_console(sc)  # its bar would glue to the ranks' lines

    def application(self) -> str:
        """The Spark application the session's runs share task slots in."""
        sc = self.session.sparkContext
        return str(getattr(sc, "applicationId", None) or id(sc))

    def turn(self) -> Turn:
        from sparktrain.driver.capacity import most_slots, total_slots

        sc = self.session.sparkContext
        ceiling = most_slots(sc.master, sc.getConf())
        return Turn(
            self.application(),
            lambda: total_slots(sc),  # live: executors come and go
            ceiling[0] if ceiling is not None else None,
        )

    def size(self, config: RunConfig, job: TaskJob, held: int, since: float | None) -> int:
        from sparktrain.driver import capacity
        from sparktrain.driver.elastic import choose_size

        sc = self.session.sparkContext
        if config.elastic is not None:
            return choose_size(sc, config, job.ranks_per_task, held, since)
        capacity.check_capacity(
            sc,
            job.tasks,
            config.capacity_wait,
            since=since,
            ranks_per_task=job.ranks_per_task,
            held=held,
        )
        return config.world_size

    def grow_watch(
        self, config: RunConfig, job: TaskJob, held: Callable[[], int]
    ) -> Callable[[int], ResizeStop | None] | None:
        from sparktrain.driver.elastic import grow_watch

        watch = grow_watch(
            self.session.sparkContext, config, config.world_size, job.ranks_per_task, held
        )
        return None if watch is None else watch.on_saved

    def channel_address(self) -> tuple[str, str]:
        conf = self.session.sparkContext.getConf()
        advertise = conf.get("spark.driver.host") or "127.0.0.1"
        # Tasks connect to spark.driver.host, so that address alone is listened on when it is
        # this machine's. It may not be (NAT, a container's published address, a proxy): then
        # the channel listens where Spark's own driver does, which tasks can reach.
        fallback = conf.get("spark.driver.bindAddress") or "0.0.0.0"
        return listen_address(advertise, fallback), advertise

    def launch(self, job: TaskJob, description: str, frame: Any) -> Launch:
        from sparktrain.driver.launch.stage import SparkLaunch

        return SparkLaunch(self.session, job, description, frame)

    def open_group(self, group: str, description: str) -> None:
        self.session.sparkContext.setJobGroup(group, description, True)

    def close_group(self, group: str) -> None:
        self.session.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    def cancel_group(self, group: str) -> None:
        self.session.sparkContext.cancelJobGroup(group)
