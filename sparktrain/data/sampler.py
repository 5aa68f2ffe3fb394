"""A distributed sampler for map-style datasets that resumes mid-epoch, at any world size.

Worker side: torch and NumPy only, never pyspark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np
import torch.utils.data

from sparktrain.data import resume_state
from sparktrain.data.resharding import Stage, StagePlan, pieces_digest, plan_stage, windows
from sparktrain.data.sharding import row_order_in_piece, validate_shard
from sparktrain.errors import ConfigurationError


class ResumableDistributedSampler(torch.utils.data.Sampler[int]):
    """Like torch's ``DistributedSampler``, plus ``state_dict()`` / ``load_state_dict()``.

    Each epoch, the indices ``0 .. len(dataset)-1`` are put in one seeded order (the same on
    every rank; ``set_epoch`` gives each epoch its own), and rank ``r`` of ``n`` takes the
    ``r``-th of ``n`` contiguous equal shares: padded by repeating the first indices
    (``drop_last=False``) or cut to a multiple of ``n`` (``drop_last=True``), as torch's
    sampler does (the shares are contiguous runs of the order instead of every ``n``-th
    index, which is what lets an epoch be split again). A restored state resumes the epoch:
    a rank's own state continues that rank; the states of all ranks (or their merged state)
    split the indices the epoch has left among any number of ranks, each once.

    The state counts the indices this sampler has handed out. A ``DataLoader`` with worker
    processes takes indices ahead of the batches it returns, so then pass what was trained:
    ``sampler.state_dict(consumed=batches_done * batch_size)``.

    Args:
        dataset: the dataset (anything with ``len()``) or its length.
        num_replicas: number of ranks; default: the run's world size.
        rank: this rank; default: the run's rank.
        shuffle: shuffle the indices each epoch.
        seed: seed of the order; must be the same on every rank.
        drop_last: cut the epoch to equal shares instead of padding it.

    Example:
        >>> sampler = ResumableDistributedSampler(dataset, seed=1)
        >>> loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
        >>> if ckpt is not None:
        ...     sampler.load_state_dict(ckpt.state["loader"])
        >>> for epoch in range(start_epoch, epochs):
        ...     sampler.set_epoch(epoch)
        ...     for batch in loader:
        ...         ...
    """

    def __init__(
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        size = dataset if isinstance(dataset, int) and not isinstance(dataset, bool) else None
        if size is None:
            size = len(dataset)  # type: ignore[arg-type]
        if (rank is None) != (num_replicas is None):
            raise ConfigurationError(
                "give both rank and num_replicas, or neither (then the run's rank and world "
                "size are used)"
            )
        if rank is None or num_replicas is None:
            from sparktrain.worker import context

            rank, num_replicas = context.rank(), context.world_size()
        validate_shard(rank, num_replicas)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigurationError(f"seed must be an int >= 0; got {seed!r}")
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self._size = size
        self._epoch = 0
        self._resume: tuple[int, list[Stage], int, int | None] | None = None
        self._cursor: resume_state.Cursor | None = None
        # The current iter()'s start: epoch, stages, rows served before, length, end.
        self._pass: tuple[int, list[Stage], int, int, int | None] | None = None
        self._config = {
            "rows": size,
            "pieces": pieces_digest([size]),
            "batch_size": 1,
            "drop_last": drop_last,
            "shuffle": shuffle,
            "seed": seed,
            "shuffle_window": 1,
        }
        # Checks the size now (an empty dataset, drop_last with fewer indices than ranks).
        self._plan(0, ())

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order next; setting the restored epoch keeps the restored place."""
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._epoch = epoch
        self._cursor = self._pass = None

    def _plan(self, epoch: int, stages: Sequence[Stage]) -> StagePlan:
        return plan_stage(
            [self._size],
            stages=stages,
            shard_count=self.num_replicas,
            shard=self.rank,
            batch_size=1,
            drop_last=self.drop_last,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            window=1,
        )

    def _start(self) -> resume_state.Cursor:
        epoch, skip, end = self._epoch, 0, self._epoch + 1  # type: int, int, int | None
        stages: list[Stage] = []
        if self._resume is not None:
            epoch, stages, skip, end = self._resume
        return resume_state.Cursor(
            self._plan, epoch=epoch, stages=stages, skip=skip, end=end, batch_size=1
        )

    def __len__(self) -> int:
        """Indices that the current ``iter()`` yields in all, or else the next one."""
        if self._pass is not None:
            return self._pass[3]
        return max(self._start().left(), 0)

    def __iter__(self) -> Iterator[int]:
        cursor = self._start()
        self._pass = (cursor.epoch, cursor.stages, cursor.skip, max(cursor.left(), 0), cursor.end)
        self._resume = None
        self._cursor = cursor
        return self._indices(cursor)

    def _indices(self, cursor: resume_state.Cursor) -> Iterator[int]:
        if cursor.left() <= 0:
            return
        plan, left = cursor.plan, cursor.skip
        order = row_order_in_piece(
            self._size, piece=0, epoch=cursor.epoch, seed=self.seed, shuffle=self.shuffle
        )
        for number, group in enumerate(windows(plan.segments, plan.window)):
            where = plan.window_positions(number, group)
            if left >= where.size:
                left -= where.size
                continue
            where, left = where[left:], 0
            values = where if order is None else order[where]
            for index in np.asarray(values).tolist():
                cursor.served_batch()
                yield index

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """This rank's place in the epoch (see the class docstring for ``consumed``).

        Args:
            consumed: indices of the current ``iter()`` that were trained; default: those
                handed out.
        """
        cursor = self._cursor
        if cursor is None:
            if self._resume is not None:
                epoch, stages, rows, end = self._resume
            else:
                epoch, stages, rows, end = self._epoch, [], 0, None
            return resume_state.shard_state(
                self._config,
                epoch=epoch,
                stages=stages,
                shard_count=self.num_replicas,
                shard=self.rank,
                rows=rows,
                end=end,
            )
        if consumed is not None and self._pass is not None:
            if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
                raise ConfigurationError(f"consumed must be an int >= 0; got {consumed!r}")
            epoch, stages, skip, length, end = self._pass
            cursor = resume_state.Cursor(
                self._plan, epoch=epoch, stages=stages, skip=skip, end=end, batch_size=1
            )
            if consumed:
                cursor.advance(min(consumed, length))
        return cursor.state(self._config, self.num_replicas, self.rank)

    def load_state_dict(self, state: Any) -> None:
        """Make the next ``iter()`` go on where a saved state left off.

        Args:
            state: this rank's own earlier state, the states of all ranks at one step (a
                list), or their merged state (a checkpoint's ``"loader"`` entry).

        Raises:
            ConfigurationError: not a sampler state, saved with other settings or another
                dataset length, or another rank's alone.
        """
        epoch, stages, rows, end = resume_state.pending(
            state,
            config=self._config,
            shard_count=self.num_replicas,
            shard=self.rank,
            what="sampler",
        )
        self._cursor = None
        self._pass = None
        self._epoch = epoch
        finished = end is not None and epoch >= end
        idle = not stages and not rows and end is None
        self._resume = None if finished or idle else (epoch, stages, rows, end)
