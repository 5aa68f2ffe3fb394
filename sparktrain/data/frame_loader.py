"""The rank's loader of a DataFrame's stream: every epoch's batches, the same number of steps on
every rank, and a place to resume from.

Every rank takes the same number of steps in each epoch when ``torch.distributed`` (or
Horovod) is initialized, so no rank waits in a collective for a peer that finished its share.
In the first epoch, whose rows arrive as the tasks read their partitions, each rank reads up to
:data:`LOOKAHEAD` batches ahead, and once per that many batches the ranks agree, with one
all-reduce of one integer over a gloo group of the loader's own, on how many all of them have;
the epoch ends for all when one rank has none left. From the second epoch on each rank knows
its count from its spill of the first, and the ranks agree once, at the epoch's start. The rows
a longer share holds beyond the shortest are not seen in that epoch.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sparktrain.errors import ConfigurationError


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

        Where the ranks agree, every rank takes as many batches as the rank with fewest has.
        From the second epoch on each rank knows its count (its spill of the first), so the
        ranks agree once, at the epoch's start. In the first epoch, whose rows arrive as the
        tasks read their partitions, each rank reads up to :data:`LOOKAHEAD` batches ahead
        and the ranks agree on how many of them all have, once per that many batches: every
        rank then takes that many, and the epoch ends when one has none left.
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
        known = self._known_batches()
        taken = itertools.islice(batches, known) if known is not None else self._read_ahead(batches)
        for batch in taken:
            self.steps += 1
            if self.steps > skip:
                yield batch

    def _read_ahead(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` as the ranks agree on them while no rank knows its count: up to
        :data:`LOOKAHEAD` read ahead, then as many as every rank holds; the end when one
        holds none."""
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
                return
            for _ in range(granted):
                yield ahead.popleft()

    def _known_batches(self) -> int | None:
        """The batches every rank takes this epoch, where every rank knows its own count
        (the least of them); None where one does not. One agreement (all ranks make it, so
        their collectives stay in step): a rank that does not know says -1."""
        mine = self._stream.batches_ahead()
        if self._agree is None:
            return mine
        least = self._agree(-1 if mine is None else mine)
        return least if least >= 0 else None

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


def agreement() -> Callable[[int], int] | None:
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
