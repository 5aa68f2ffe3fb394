"""The driver's ``horovod.torch`` where Horovod is not installed: names, and where they run.

``import horovod.torch as hvd`` at the top of a notebook cell gives this (through the finder
that ``sparktrain-horovod.pth`` installs, see ``_sparktrain_horovod``). Constants and classes
(``hvd.Average``, ``hvd.Compression.fp16``) are the built-in implementation's. Every function
is a stand-in: inside a rank it calls that rank's own ``horovod.torch`` (so a function taken
with ``from horovod.torch import allreduce`` works there too); anywhere else it raises
:class:`~sparktrain.errors.ConfigurationError` saying that Horovod's functions run on the
ranks of ``HorovodRunner(np=...).run(fn)``, inside ``fn``.

A training function that uses the module (``hvd.init()``) is pickled with the module by its
name, so on a rank ``hvd`` is that rank's ``horovod.torch``, never this.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from sparktrain import contract
from sparktrain.errors import ConfigurationError
from sparktrain.hvdcompat import api

# The functions of the built-in API, by name: each gets a stand-in here.
_FUNCTIONS = sorted(name for name in api.__all__ if inspect.isfunction(getattr(api, name)))


def _in_rank() -> bool:
    """Whether this process is one of a run's ranks (the worker sets the run's variables)."""
    return contract.RUN_ID_ENV in os.environ


def _ranks_module() -> types.ModuleType | None:
    """This rank's own ``horovod.torch`` (Horovod's or the built-in one), or None."""
    module = sys.modules.get("horovod.torch") or importlib.import_module("horovod.torch")
    if module.__dict__.get("__sparktrain_standin__"):
        return None
    return module


def _standin(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        module = _ranks_module() if _in_rank() else None
        if module is None:
            raise ConfigurationError(
                f"hvd.{name}() was called outside a Horovod rank: Horovod is not installed "
                "here, and horovod.torch is sparktrain's stand-in, which only names Horovod's "
                "API. Call it inside the function you give to HorovodRunner(np=...).run(fn) "
                "(or SparkRunner(backend='horovod')): there every rank has a working "
                "horovod.torch"
            )
        return getattr(module, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = __name__
    call.__doc__ = f"``hvd.{name}`` on a rank; on the driver, an error saying so."
    return call


for _name in _FUNCTIONS:
    globals()[_name] = _standin(_name)
del _name


def fill(module: types.ModuleType) -> None:
    """Give the stand-in ``horovod.torch`` module its names."""
    for name in api.__all__:
        module.__dict__[name] = globals()[name] if name in _FUNCTIONS else getattr(api, name)
    module.__dict__["__all__"] = list(api.__all__)
    module.__dict__["__sparktrain_standin__"] = True
    module.__dict__["__getattr__"] = api.__getattr__
    module.__doc__ = __doc__
