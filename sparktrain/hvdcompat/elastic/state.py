"""``hvd.elastic.State``, ``ObjectState`` and ``TorchState``: what a commit keeps.

As in Horovod, ``commit()`` saves a copy in memory (``restore()`` goes back to it) and checks
for a stop request; here it also writes the copy through :mod:`sparktrain.checkpoint` when the
run names a folder for it (see :mod:`~sparktrain.hvdcompat.elastic.commits`), so that the
processes a restart launches resume from it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch

from sparktrain.hvdcompat.autograd import allreduce
from sparktrain.hvdcompat.basics import rank
from sparktrain.hvdcompat.collectives import Max
from sparktrain.hvdcompat.elastic.commits import Commits, check_keepable
from sparktrain.hvdcompat.elastic.handlers import Handler, handler_for
from sparktrain.hvdcompat.exceptions import HostsUpdatedInterrupt
from sparktrain.hvdcompat.functions import broadcast_object
from sparktrain.worker import context


class State:
    """State kept across failures and resizes (``horovod.common.elastic.State``).

    Subclasses define ``save``, ``restore`` and ``sync``; only :class:`ObjectState` and
    :class:`TorchState` also persist their commits to the run's commit folder.

    Args:
        bcast_object: broadcasts a Python object from rank 0 (``hvd.broadcast_object``).
        get_rank: this process's rank (``hvd.rank``).
    """

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = broadcast_object,
        get_rank: Callable[[], int] = rank,
    ) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = Commits(None)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Add functions to call after a reset: a change of size, or a retry after an error.

        Example:
            >>> state.register_reset_callbacks([lambda: scale_lr(hvd.size())])  # doctest: +SKIP
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run :meth:`reset`, then every reset callback in the order they were registered."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (in memory, and in the run's commit folder when it has one), then
        check for a stop request (:meth:`check_host_updates`).

        Raises:
            HostsUpdatedInterrupt: on every rank, when sparktrain asked the ranks to stop.
        """
        self.save()
        self._commits.write(self._snapshot())
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise on every rank together when any rank was asked to stop.

        The request is ``sparktrain.should_stop()`` (SIGTERM: a resize of an elastic run, a
        preemption, a cancellation); the ranks agree with one small allreduce, so every rank
        calls this at the same point (``commit()`` does).

        Raises:
            HostsUpdatedInterrupt: when a rank has been asked to stop.
        """
        asked = torch.tensor([1 if context.should_stop() else 0], dtype=torch.int32)
        if int(allreduce(asked, op=Max, name="elastic.check_host_updates").item()):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        """Save the state in memory."""
        raise NotImplementedError("a State subclass defines save()")

    def restore(self) -> None:
        """Go back to the last commit, undoing changes made since."""
        raise NotImplementedError("a State subclass defines restore()")

    def sync(self) -> None:
        """Give every rank rank 0's state."""
        raise NotImplementedError("a State subclass defines sync()")

    def reset(self) -> None:
        """Adjust to a new size, before the sync (nothing by default)."""

    def _snapshot(self) -> dict[str, Any]:
        """The last commit as plain data for the commit folder ({} for a State of the user's
        own, whose commits stay in memory)."""
        return {}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Make a commit read from the commit folder the live and the saved state."""


class ObjectState(State):
    """Python values kept as attributes (``horovod.common.elastic.ObjectState``).

    Args:
        bcast_object: broadcasts a Python object from rank 0.
        get_rank: this process's rank.
        **kwargs: the values, each exposed as an attribute of the same name.
    """

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = broadcast_object,
        get_rank: Callable[[], int] = rank,
        **kwargs: Any,
    ) -> None:
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        """Copy every attribute's value (a deep copy: a list appended to after the commit
        goes back to what it was on ``restore``)."""
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        """Set every attribute back to its committed value."""
        self._set_attrs()

    def sync(self) -> None:
        """Give every rank rank 0's committed values."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def _snapshot(self) -> dict[str, Any]:
        if self._commits.directory is not None:
            for name, value in self._saved_state.items():
                check_keepable(value, f"state.{name}")
        return {"objects": self._saved_state}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        self._saved_state.update(snapshot.get("objects", {}))
        self._set_attrs()


class TorchState(ObjectState):
    """A PyTorch training's state (``hvd.elastic.TorchState``).

    Models, optimizers, learning-rate schedulers and :class:`ElasticSampler` objects are kept
    through their ``state_dict()`` (and broadcast as Horovod does: parameters, optimizer
    state); any other value is kept as in :class:`ObjectState`.

    Args:
        model: a ``torch.nn.Module``, or None.
        optimizer: a ``torch.optim.Optimizer`` (``hvd.DistributedOptimizer`` included), or None.
        **kwargs: more values: modules, optimizers, schedulers, samplers or plain values.

    Example:
        >>> state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)  # doctest: +SKIP
    """

    _handlers: dict[str, Handler]

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        """Save every handled object's ``state_dict()`` and the plain values."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        """Load every handled object's saved state, and the plain values, back."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Broadcast rank 0's parameters, optimizer state, other objects and values."""
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _snapshot(self) -> dict[str, Any]:
        saved = {name: handler.saved for name, handler in self._handlers.items()}
        if self._commits.directory is not None:
            for name, value in saved.items():
                check_keepable(value, f"state.{name}.state_dict()")
        return {**super()._snapshot(), "handlers": saved}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        for name, saved in snapshot.get("handlers", {}).items():
            if name in self._handlers:
                self._handlers[name].saved = saved
                self._handlers[name].restore()
        super()._load_snapshot(snapshot)
