"""What the two Spark places (classic and Connect) check alike before a run."""

from __future__ import annotations

import inspect
from typing import Any

from sparktrain.config import RunConfig
from sparktrain.driver.places.base import Place
from sparktrain.errors import ConfigurationError


class SessionPlace(Place):
    """A place whose ranks run in a Spark stage of ``session``."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def check(self, config: RunConfig, conf: Any) -> int:
        from sparktrain.driver.elastic import smallest
        from sparktrain.driver.preflight import check_application, ranks_per_task
        from sparktrain.shipping import kept

        check_application(conf, config)
        per_task = ranks_per_task(conf, config)
        if config.elastic is not None:
            self.check_elastic(config)
            smallest(config, per_task)
        # This host's old kept results (a local run's tasks do this themselves).
        kept.sweep(config.kept_results_ttl)
        return per_task

    def check_elastic(self, config: RunConfig) -> None:
        """Refuse an elastic run the place cannot size."""

    def partitions(self, frame: Any) -> int | None:
        """How many partitions ``frame`` has, where the place can tell before a run."""
        return None

    def check_own_partitions(self, frame: Any, tasks: int) -> None:
        from sparktrain.driver.frame_input import check_own_partitions

        check_own_partitions(self.partitions(frame), tasks)

    def check_frame(self, frame: Any) -> None:
        from sparktrain.driver.places import place_for

        owner = getattr(frame, "sparkSession", None)
        if owner is not None and place_for(owner).kind != self.kind:
            raise ConfigurationError(
                f"the DataFrame belongs to a {place_for(owner).kind} session, but the run goes "
                f"to a {self.kind} one: build the DataFrame from the session the run uses "
                "(SparkRunner(spark=...))"
            )
        if "barrier" not in inspect.signature(type(frame).mapInArrow).parameters:
            raise ConfigurationError(
                "training from a DataFrame on executors runs a barrier mapInArrow stage, which "
                "PySpark 3.5 and later have: upgrade pyspark, or use make_spark_converter(df)"
            )
