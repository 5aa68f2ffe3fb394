"""``hvd.elastic.ElasticSampler``: an epoch's rows dealt to the ranks, resumed exactly where it
was at any number of ranks."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch.utils.data

from sparktrain.hvdcompat.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Deal a dataset's indices to the ranks, and deal what is left again after a reset.

    As Horovod's: the epoch's order is ``range(len(dataset))``, shuffled with ``seed + epoch``
    when ``shuffle``; rank ``r`` of ``n`` takes every n-th index of what is left, from the
    r-th, padded with the first ones so every rank has as many. ``record_batch`` counts the
    rows every rank took in a batch, so the rows read are always the head of the order:
    kept in a :class:`TorchState` and committed, the sampler resumes after a restart or a
    change of size with exactly the rows not processed yet. ``record_indices`` marks single
    indices instead (use one or the other within an epoch).

    Args:
        dataset: the dataset (its length is read; it must not change).
        shuffle: shuffle the order of each epoch (the same on every rank).
        seed: the shuffle's seed; every rank passes the same.

    Example:
        >>> sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)  # doctest: +SKIP
        >>> loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
        >>> state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (call it at the end of an epoch, so that
        an epoch cut short resumes rather than starts again)."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a batch of ``batch_size`` rows as processed, on every rank.

        Args:
            batch_idx: the batch's index in the epoch (kept for Horovod's signature).
            batch_size: the rows each rank took in it.
        """
        self.processed_num += batch_size * self.num_replicas

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch ``batch_idx`` (of ``batch_size``) since the reset."""
        start = batch_idx * batch_size
        return self._share()[start : start + batch_size]

    def record_indices(self, indices: Iterable[int]) -> None:
        """Mark ``indices`` as processed (a commit joins every rank's)."""
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self) -> dict[str, Any]:
        """The epoch and what is processed: ``epoch``, ``processed_num``,
        ``processed_indices`` (a sorted list)."""
        return {
            "epoch": self.epoch,
            "processed_num": self.processed_num,
            "processed_indices": sorted(self.processed_indices),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take up a state (any rank's, saved at any size), and deal what is left."""
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def reset(self) -> None:
        """Deal the rows not processed yet to the ranks there are now."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        if self.processed_indices:
            order = [i for i in order if i not in self.processed_indices]
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def _share(self) -> list[int]:
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[: self.total_size - len(padded)]
        return padded[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._share()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
