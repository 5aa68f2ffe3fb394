"""A run given a DataFrame (``sparktrain.data.from_dataframe``): found among the function's
arguments, checked before anything starts, and turned into what the stage runs over."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sparktrain.config import RunConfig
from sparktrain.errors import ConfigurationError


def frame_source(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any | None:
    """The one :class:`~sparktrain.data.frame_source.DataFrameSource` among the arguments.

    Raises:
        ConfigurationError: more than one, or one that lost its DataFrame (unpickled).
    """
    from sparktrain.data.frame_source import DataFrameSource

    found = [
        name
        for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]
        if isinstance(value, DataFrameSource)
    ]
    if not found:
        return None
    if len(found) > 1:
        raise ConfigurationError(
            f"one run reads one DataFrame, but {', '.join(found)} are each from_dataframe(...): "
            "join or union them into one DataFrame first, or run them one after the other"
        )
    name = found[0]
    source = kwargs[name] if name in kwargs else args[int(name.split()[-1])]
    if source.dataframe is None:
        raise ConfigurationError(
            f"{name} describes a DataFrame but holds none (it was pickled and read back): "
            "call from_dataframe(df, ...) on the driver that runs the function"
        )
    return source


@dataclasses.dataclass(frozen=True)
class StageFrame:
    """What a run given a DataFrame runs its stage over.

    Attributes:
        frame: the DataFrame, its columns chosen.
        shuffle_seed: with a global shuffle, the seed of the hash that sends each row to a
            task (None: rows are dealt to the tasks round-robin, in near-equal shares).
        own_partitions: no shuffle: each task streams one of the frame's own partitions
            (it has as many as the stage has tasks: a barrier stage cannot coalesce).
    """

    frame: Any
    shuffle_seed: int | None = None
    own_partitions: bool = False

    def partitioned(self, n: int) -> Any:
        """The frame in ``n`` partitions, one per task (Spark's shuffle, to local disks; or
        the frame's own ``n`` partitions, as Spark computes them)."""
        if self.own_partitions:
            return self.frame
        if self.shuffle_seed is None:
            return self.frame.repartition(n)
        return self.frame.repartition(n, self._key())

    def ordered(self) -> Any:
        """The frame as the driver reads it for local ranks: in a seeded order with a global
        shuffle (one sort), else as it is."""
        return self.frame if self.shuffle_seed is None else self.frame.orderBy(self._key())

    def _key(self) -> Any:
        from pyspark.sql import functions as F  # noqa: N812 - Spark's own spelling

        columns = [F.col(f"`{name}`") for name in self.frame.columns]
        return F.xxhash64(F.lit(self.shuffle_seed), *columns)


def stage_frame(source: Any, place: Any, config: RunConfig, tasks: int) -> StageFrame:
    """What the run's stage runs over (the DataFrame, its columns chosen), once checked.

    Args:
        source: the run's DataFrameSource.
        place: where the run goes (a :class:`~sparktrain.driver.places.Place`).
        config: the run's settings.
        tasks: the stage's task count.

    Raises:
        ConfigurationError: the run cannot read it: launcher='mpi', what the place refuses
            (a DataFrame of a session of another kind than the run's, a PySpark without
            barrier ``mapInArrow``), or ``repartition=False`` where the frame's partitions
            are not one per task (or the place cannot count them).
    """
    if config.launcher == "mpi":
        raise ConfigurationError(
            "a run given a DataFrame streams each task's partition to the ranks it starts, but "
            "launcher='mpi' starts them from mpirun: use launcher='gloo' (the default)"
        )
    frame = source.dataframe
    place.check_frame(frame)
    if source.columns is not None:
        frame = frame.select(*source.columns)
    if not source.repartition:
        place.check_own_partitions(frame, tasks)
    seed = (source.seed or 0) if source.global_shuffle else None
    return StageFrame(frame, seed, own_partitions=not source.repartition)


def check_own_partitions(found: int | None, tasks: int) -> None:
    """Refuse a stage over a frame's own partitions that are not one per task."""
    if found is None:
        raise ConfigurationError(
            "from_dataframe(repartition=False) runs the stage over the DataFrame's own "
            "partitions, which this session cannot count before the run (a Spark Connect "
            "client): use the default repartition=True"
        )
    if found != tasks:
        raise ConfigurationError(
            f"from_dataframe(repartition=False) runs the stage over the DataFrame's own "
            f"partitions, one per task (a barrier stage cannot merge or split them), but it "
            f"has {found} for {tasks} tasks: use repartition=True (the default), or read it "
            f"in {tasks} partitions (e.g. spark.range(..., numPartitions={tasks}), files of "
            "that count, or spark.sql.files.maxPartitionBytes)"
        )
