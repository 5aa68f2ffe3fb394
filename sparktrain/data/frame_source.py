"""Training straight from a DataFrame: the description a run carries, and the rank's loader.

``from_dataframe(df, batch_size, ...)`` returns a :class:`DataFrameSource`: a small picklable
description of how to read ``df`` (no data). Passed to the training function like any
argument, it tells the runner to run its barrier stage over ``df`` itself, repartitioned to the
stage's task count: each task streams its partition's Arrow batches to its ranks as Spark
computes them (:mod:`sparktrain.data.stream`), with no copy on shared storage. With ``np < 0``
the driver reads ``df`` a partition at a time and streams it to the local ranks the same way.

On a rank, ``source.loader()`` opens this rank's stream::

    def train(data):
        with data.loader() as batches:
            for batch in batches:             # every epoch in turn (num_epochs)
                step(batch["features"], batch["label"])

    SparkRunner(np=2).run(train, data=from_dataframe(df, batch_size=64, num_epochs=3))

Every rank takes the same number of steps in each epoch: see
:mod:`sparktrain.data.frame_loader`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sparktrain import contract
from sparktrain.data.frame_loader import FrameLoader, agreement
from sparktrain.errors import ConfigurationError

Batch = dict[str, Any]


@dataclasses.dataclass
class DataFrameSource:
    """How the ranks read a DataFrame (see :func:`from_dataframe`); the DataFrame itself stays
    on the driver: it is left out when the description is pickled.

    Attributes:
        batch_size: rows per batch.
        num_epochs: how many times the loader goes through this rank's rows.
        shuffle: shuffle within this rank's share, through ``shuffle_buffer`` rows.
        seed: the shuffle's seed (each epoch's order comes from ``(seed, epoch)``).
        drop_last: leave out each epoch's last batch on a rank when it is short.
        columns: the columns the batches hold (default all).
        transform: called on each batch dict on the rank; its result is what the loop gets.
        shuffle_buffer: rows a rank holds for its shuffle.
        window: batches each rank may hold unread in its stream (the task waits beyond).
        global_shuffle: send each row to a task by a hash seeded with ``seed`` (see
            :func:`from_dataframe`).
        repartition: the stage deals the rows to its tasks (Spark's shuffle); False: each
            task streams one of the DataFrame's own partitions as Spark computes it.
    """

    batch_size: int
    num_epochs: int = 1
    shuffle: bool = False
    seed: int | None = None
    drop_last: bool = False
    columns: tuple[str, ...] | None = None
    transform: Callable[[Batch], Any] | None = None
    shuffle_buffer: int = 10_000
    window: int = 2
    global_shuffle: bool = False
    repartition: bool = True
    dataframe: Any = dataclasses.field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["dataframe"] = None  # the driver's: the ranks get its rows through their stream
        return state

    @contextlib.contextmanager
    def loader(self) -> Iterator[FrameLoader]:
        """This rank's batches, as dicts of tensors, epoch after epoch (only on a rank).

        Raises:
            ConfigurationError: called outside a rank of a run that was given this source.
        """
        address = os.environ.get(contract.STREAM_ENV)
        index = os.environ.get(contract.STREAM_INDEX_ENV)
        if not address or index is None:
            raise ConfigurationError(
                "data.loader() reads the stream a run opens for its DataFrame: call it inside "
                "the training function of a run given this description, e.g. "
                "SparkRunner(np=2).run(train, data=from_dataframe(df, batch_size=64))"
            )
        from sparktrain.data.stream.loader import RankStream

        stream = RankStream(
            address,
            int(index),
            self.batch_size,
            shuffle_buffer=self.shuffle_buffer if self.shuffle else 0,
            seed=self.seed if self.seed is not None else 0,
            drop_last=self.drop_last,
            columns=self.columns,
            transform=self.transform,
            local_dir=os.environ.get(contract.STREAM_DIR_ENV) or None,
            spill=self.num_epochs > 1,
        )
        with stream:
            yield FrameLoader(stream, self.num_epochs, agreement())


def from_dataframe(
    df: Any,
    batch_size: int,
    num_epochs: int = 1,
    shuffle: bool = False,
    seed: int | None = None,
    drop_last: bool = False,
    columns: Sequence[str] | None = None,
    transform: Callable[[Batch], Any] | None = None,
    shuffle_buffer: int = 10_000,
    window: int = 2,
    global_shuffle: bool = False,
    repartition: bool = True,
) -> DataFrameSource:
    """Describe how a run's ranks read ``df``, streamed from its partitions (no copy).

    Pass the result to the training function as an argument; on each rank, ``loader()`` gives
    this rank's batches (see :mod:`sparktrain.data.frame_source`). Column rules as for
    ``make_torch_dataloader``: numbers become 1-D tensors, arrays and ML vectors 2-D tensors,
    binary and strings stay lists for ``transform``.

    Args:
        df: a Spark DataFrame (classic or Spark Connect).
        batch_size: rows per batch.
        num_epochs: passes over the data; epochs after the first read each rank's local spill
            of the first (Spark computes the DataFrame once per run attempt).
        shuffle: shuffle each rank's rows within ``shuffle_buffer`` rows, anew each epoch.
        seed: the shuffle's seed (default 0: the same order on every run).
        drop_last: leave out a rank's short last batch in each epoch.
        columns: the columns to read (default all); read from ``df`` before anything starts.
        transform: called on each batch on the rank (e.g. decode bytes); must pickle.
        shuffle_buffer: rows held for the shuffle on each rank.
        window: batches each rank may hold unread before its task waits (memory bound).
        global_shuffle: the stage's repartition sends each row to a task by a hash of the
            row and ``seed`` instead of dealing rows round-robin: any row may reach any rank,
            once per run (every epoch then shuffles within that share). It costs no more
            than the round-robin repartition (the same one shuffle), but the shares are no
            longer near equal, so the equal-steps rule leaves more rows unseen each epoch
            (about the square root of a share's size). With ``np < 0`` the driver reads the
            DataFrame sorted by that hash (one sort).
        repartition: True (the default) deals the rows to the stage's tasks round-robin
            through Spark's shuffle: near-equal shares, but the whole DataFrame is computed
            and written to the executors' local disks before the first batch. False runs the
            stage over the DataFrame's own partitions, one per task (no shuffle): each task
            streams its partition as Spark computes it, so the first batch comes as soon as
            the first rows do, but the shares are as unequal as the partitions (the
            equal-steps rule leaves a longer share's extra rows unseen each epoch). For a
            DataFrame read in exactly as many near-equal partitions as the stage has tasks
            (a barrier stage cannot merge or split them); classic sessions only.

    Raises:
        ConfigurationError: a value out of range, a column ``df`` does not have, one of a
            type the loader cannot turn into a tensor (read from ``df``'s schema), or
            executors whose Python cannot import sparktrain, torch and pyarrow.
    """
    for name, value, least in (
        ("batch_size", batch_size, 1),
        ("num_epochs", num_epochs, 1),
        ("shuffle_buffer", shuffle_buffer, 0),
        ("window", window, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigurationError(
                f"from_dataframe: {name} must be an int >= {least}, not {value!r}"
            )
    if global_shuffle and not repartition:
        raise ConfigurationError(
            "from_dataframe: global_shuffle=True is a repartition by a hash of each row, so it "
            "cannot go with repartition=False: drop one of them"
        )
    if transform is not None and not callable(transform):
        raise ConfigurationError(f"from_dataframe: transform must be callable, not {transform!r}")
    names = getattr(df, "columns", None)
    if names is None or not hasattr(df, "repartition"):
        raise ConfigurationError(
            f"from_dataframe takes a Spark DataFrame, not {type(df).__name__}: for tensors or a "
            "pandas frame, pass them to the function as they are"
        )
    if isinstance(columns, str):
        columns = [columns]
    if columns is not None:
        missing = [c for c in columns if c not in names]
        if missing or not columns:
            raise ConfigurationError(
                f"from_dataframe: columns {missing or list(columns)} are not in the DataFrame, "
                f"whose columns are {list(names)}"
            )
    from sparktrain.data.converter import _check_spark_types

    schema = df.schema
    wanted = [f for f in schema.fields if columns is None or f.name in columns]
    _check_spark_types(type(schema)(wanted))
    _check_executors(df)
    return DataFrameSource(
        batch_size=batch_size,
        num_epochs=num_epochs,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        columns=tuple(columns) if columns is not None else None,
        transform=transform,
        shuffle_buffer=shuffle_buffer,
        window=window,
        global_shuffle=bool(global_shuffle),
        repartition=bool(repartition),
        dataframe=df,
    )


def _check_executors(df: Any) -> None:
    """Refuse, with a run's message, executors whose Python a run's stage cannot use: its
    tasks hand their partitions to Python as Arrow batches, so it must import pyarrow too (one
    one-task job, once per SparkContext and interpreter, whose report the run's own check
    reuses; none on a local master running this interpreter, nor for Spark Connect)."""
    from sparktrain.shipping.python_probe import check_executor_python, classic_context

    sc = classic_context(getattr(df, "sparkSession", None))
    if sc is not None:
        check_executor_python(sc, data=True)
