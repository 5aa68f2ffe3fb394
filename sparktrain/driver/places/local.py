"""The driver's own processes (``np < 0``): no Spark, no slots to count, loopback only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparktrain.config import RunConfig
from sparktrain.driver.places.base import Place

if TYPE_CHECKING:
    from sparktrain.driver.launch import Launch
    from sparktrain.task.assignment import TaskJob


class LocalPlace(Place):
    """Ranks run as subprocesses of the driver under the local supervisor."""

    def check(self, config: RunConfig, conf: Any) -> int:
        from sparktrain.task.entry import local_gpus

        local_gpus(config.use_gpu, config.world_size)  # no GPUs for use_gpu=True: say so now
        return 1

    def launch(self, job: TaskJob, description: str, frame: Any) -> Launch:
        from sparktrain.driver.launch.local import LocalLaunch

        if frame is None:
            return LocalLaunch(job)
        from sparktrain.driver.places import place_for

        # The driver reads the DataFrame in Spark jobs of the session it belongs to.
        return LocalLaunch(job, frame, place_for(frame.frame.sparkSession))
