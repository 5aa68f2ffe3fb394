"""How :class:`~sparktrain.hvdcompat.elastic.state.TorchState` keeps each kind of object: a
saved ``state_dict()``, and the broadcast that gives every rank rank 0's."""

from __future__ import annotations

import copy
from typing import Any

import torch

from sparktrain.hvdcompat.elastic.sampler import ElasticSampler
from sparktrain.hvdcompat.functions import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from sparktrain.hvdcompat.objects import allgather_object


class Handler:
    """One object of a state: its value and the ``state_dict()`` its last commit saved.

    Args:
        value: the object (it has ``state_dict()`` and ``load_state_dict()``).
    """

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved: Any = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        """Copy the object's state."""
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        """Load the saved state back into the object."""
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self) -> None:
        """Give every rank rank 0's state of the object."""
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def set_value(self, value: Any) -> None:
        """Replace the object (``state.model = new_model``), and save it at once."""
        self.value = value
        self.save()


class ModelHandler(Handler):
    """A ``torch.nn.Module``: its parameters and buffers are broadcast in place."""

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerHandler(Handler):
    """A ``torch.optim.Optimizer``: its state and hyper-parameters are broadcast."""

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerHandler(Handler):
    """An :class:`ElasticSampler`: a commit keeps what every rank has read, together."""

    def save(self) -> None:
        mine = self.value.state_dict()
        everyone = allgather_object(mine["processed_indices"])
        mine["processed_indices"] = sorted(set().union(*map(set, everyone)))
        self.saved = mine


def handler_for(value: Any) -> Handler | None:
    """The handler of ``value``, or None for a value kept as a plain Python object."""
    if isinstance(value, torch.nn.Module):
        return ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return OptimizerHandler(value)
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return Handler(value)
    if isinstance(value, ElasticSampler):
        return SamplerHandler(value)
    return None
