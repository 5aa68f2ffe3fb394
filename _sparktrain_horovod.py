"""``import horovod.torch`` where Horovod is not installed: sparktrain's driver stand-in.

Notebooks written for Databricks' HorovodRunner import ``horovod.torch as hvd`` at the top of
a cell, before HorovodRunner itself, and use ``hvd`` inside the training function. The ranks
of sparktrain's HorovodRunner get a ``horovod.torch`` (Horovod's, or sparktrain's built-in one
on torch.distributed); the driver may have none. So ``sparktrain-horovod.pth`` runs
:func:`install` when the interpreter starts: it adds a finder *last* on ``sys.meta_path``,
which answers ``horovod`` and ``horovod.torch`` only when no other finder found them (an
installed Horovod always wins). The stand-in names Horovod's API; its functions, called on
the driver, raise an error that says where they run (see :mod:`sparktrain.hvdcompat.standin`).
A function that uses ``hvd`` travels to the ranks by the module's name, so there ``hvd`` is the
ranks' own ``horovod.torch``.

This module is stdlib only and imports nothing of sparktrain (or torch) until ``horovod.torch``
is imported: every interpreter of the environment runs it at start. ``SPARKTRAIN_HOROVOD_STANDIN=0``
turns the stand-in off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

# The origin of the stand-in's module specs, how they are told from an installed Horovod.
ORIGIN = "sparktrain's driver stand-in for horovod (Horovod is not installed)"
OFF_ENV = "SPARKTRAIN_HOROVOD_STANDIN"
_NAMES = ("horovod", "horovod.torch")


def is_standin(spec: Any) -> bool:
    """Whether a module spec (``importlib.util.find_spec``'s answer) is the stand-in's."""
    return getattr(spec, "origin", None) == ORIGIN


def _enabled() -> bool:
    return os.environ.get(OFF_ENV, "").strip().lower() not in ("0", "false", "off", "no")


class StandinFinder(importlib.abc.MetaPathFinder):
    """Finds ``horovod`` and ``horovod.torch`` when no finder before it did."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The stand-in's spec for the two names, or None (not ours, or turned off)."""
        if fullname not in _NAMES or not _enabled():
            return None
        if fullname == "horovod.torch":
            parent = sys.modules.get("horovod")
            if not is_standin(getattr(parent, "__spec__", None)):
                return None  # a real horovod package without torch: let its error show
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(), origin=ORIGIN, is_package=True)
        spec.submodule_search_locations = []
        return spec


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "horovod":
            module.__doc__ = (
                "sparktrain's driver stand-in for Horovod, which is not installed here: "
                "only horovod.torch, whose functions run on HorovodRunner's ranks"
            )
            return
        from sparktrain.hvdcompat import standin

        standin.fill(module)


def install() -> None:
    """Put the stand-in's finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, StandinFinder) for finder in sys.meta_path):
        sys.meta_path.append(StandinFinder())
