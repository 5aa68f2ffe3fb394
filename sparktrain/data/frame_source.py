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

Every rank takes the same number of steps in each epoch when ``torch.distributed`` is
initialized (a DDP or Horovod run): each rank reads up to :data:`LOOKAHEAD` batches ahead, and
once per that many batches the ranks agree, with one all-reduce of one integer over a gloo
group of the loader's own, on how many all of them have; the epoch ends for all when one rank
has none left (so no rank waits in a collective for a peer that finished its share). The rows a
longer share holds beyond that are not seen in that epoch.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sparktrain import contract
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
            yield FrameLoader(stream, self.num_epochs, _agreement())


class FrameLoader:
    """One rank's batches over ``num_epochs`` epochs; :attr:`epoch` is the one being read and
    :attr:`steps` the batches it has served so far.

    Iterating gives every epoch left in turn; :meth:`next_epoch` gives one. Its place is
    :meth:`state_dict` (the same on every rank when the ranks agree), which a restarted run
    gives back to :meth:`load_state_dict` before iterating: at the same number of ranks it
    goes on at the next batch, the rows and order of an uninterrupted run (the DataFrame
    must give the same rows in the same order, as a table or file scan does); at another
    number of ranks the shares differ, so a place mid-epoch is refused unless the saved
    epoch is to start over (``restart_epoch=True``).
    """

    def __init__(self, stream: Any, num_epochs: int, agree: Callable[[int], int] | None) -> None:
        self._stream = stream
        self.num_epochs = num_epochs
        self._agree = agree
        self._world = int(os.environ.get("WORLD_SIZE", "1"))
        self.epoch = 0
        self.steps = 0  # batches served in the current epoch
        self._skip = 0  # batches of the current epoch a resumed run has already taken
        self._started = False

    def __iter__(self) -> Iterator[Any]:
        while self.epoch < self.num_epochs:
            yield from self.next_epoch()

    def next_epoch(self) -> Iterator[Any]:
        """The next epoch's batches (after a resume: what is left of the saved one).

        Where the ranks agree, each rank reads up to :data:`LOOKAHEAD` batches ahead and the
        ranks agree on how many of them all have, once per that many batches: every rank
        then takes that many, and the epoch ends when one has none left.
        """
        if self._started:
            self.epoch += 1
        self._started = True
        if self.epoch >= self.num_epochs:
            return
        self._stream.epoch = self.epoch  # its shuffle and its source follow the epoch
        self.steps = 0
        skip, self._skip = self._skip, 0
        batches = iter(self._stream)
        ahead: collections.deque[Any] = collections.deque()
        ended = False
        while True:
            while not ended and len(ahead) < (LOOKAHEAD if self._agree else 1):
                batch = next(batches, _END)
                if batch is _END:
                    ended = True
                else:
                    ahead.append(batch)
            granted = self._agree(len(ahead)) if self._agree is not None else len(ahead)
            if granted == 0:
                break
            for _ in range(granted):
                self.steps += 1
                batch = ahead.popleft()
                if self.steps > skip:
                    yield batch

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: the epoch and the batches taken in it."""
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "steps": self.steps,
            "world_size": self._world,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, restart_epoch: bool = False) -> None:
        """Go on from ``state`` (a :meth:`state_dict`), before the first batch is taken.

        At the number of ranks that saved it, the loader goes on at the next batch exactly.
        At another number, each rank's share of an epoch differs, so a place mid-epoch cannot
        be found again: that is refused unless ``restart_epoch=True``, which reads the saved
        epoch again from its start (its rows already trained on are read again). A place at
        an epoch's start loads at any size.

        Raises:
            ConfigurationError: ``state`` is not this loader's, batches were taken already, or
                it was saved mid-epoch at another number of ranks without ``restart_epoch``.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ConfigurationError(
                f"load_state_dict takes what a DataFrame loader's state_dict() gave, not "
                f"{state!r:.200}"
            )
        if self._started:
            raise ConfigurationError("load_state_dict must come before the first batch")
        epoch, steps, saved = int(state["epoch"]), int(state["steps"]), int(state["world_size"])
        if saved != self._world and steps and not restart_epoch:
            raise ConfigurationError(
                f"this loader's place was saved by {saved} ranks after {steps} batches of "
                f"epoch {epoch}, and this run has {self._world}: each rank's share of an epoch "
                "depends on the number of ranks, so the batches left cannot be found exactly. "
                f"Pass load_state_dict(state, restart_epoch=True) to read epoch {epoch} again "
                f"from its start (its {steps} batches per rank already taken are read again), "
                f"or run at np={saved} to go on exactly"
            )
        self.epoch = epoch
        self._skip = steps if saved == self._world else 0


STATE_FORMAT = "sparktrain.data.from_dataframe/1"
# Batches each rank reads ahead where the ranks agree on their steps: they agree once per
# this many (one all-reduce of one integer), and hold this many batches at most.
LOOKAHEAD = 16
_END = object()


def _agreement() -> Callable[[int], int] | None:
    """The least of a number over all ranks, through torch.distributed where it is
    initialized, else through an initialized Horovod (the installed one runs without
    torch.distributed); None where neither is (nothing then waits on a peer)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not dist.is_available() or not dist.is_initialized():
        return _horovod_agreement(torch)
    if dist.get_world_size() < 2:
        return None
    # A group of its own (gloo: a CPU integer, whatever the training's backend), so the
    # loader's all-reduce never meets the training's collectives.
    group = dist.new_group(backend="gloo")
    count = torch.zeros(1, dtype=torch.int64)

    def least(mine: int) -> int:
        count.fill_(mine)
        dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
        return int(count.item())

    return least


def _horovod_agreement(torch: Any) -> Callable[[int], int] | None:
    """The least of a number over an initialized Horovod's ranks, or None."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return None
    try:
        if not hvd.is_initialized() or hvd.size() < 2:
            return None
    except Exception:  # noqa: BLE001 - a Horovod that cannot say is not initialized
        return None
    calls = iter(range(1 << 62))

    def least(mine: int) -> int:
        # Each call its own name: Horovod matches collectives across ranks by name.
        name = f"sparktrain.from_dataframe.steps.{next(calls)}"
        value = hvd.allreduce(torch.tensor([mine], dtype=torch.int64), op=hvd.Min, name=name)
        return int(value.item())

    return least


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
