"""Patch a module of another package in a rank, once that package is imported.

Importing a framework up front would cost its import time on every rank, whether or not the
function uses it; so a finder on ``sys.meta_path`` finds nothing itself but hands the named
modules' specs to a loader that runs the real loader and then the patch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Patch = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch."""

    def __init__(self, loader: importlib.abc.Loader, patch: Patch) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ... as the real one
        return getattr(self._loader, name)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; hands the modules named ``names`` to a loader that patches them.

    Args:
        names: The full names of the modules to patch.
        patch: Called with each of them once it is executed; it must be idempotent.
    """

    def __init__(self, names: frozenset[str], patch: Patch) -> None:
        self.names = names
        self.patch = patch

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self.patch)
                return spec
        return None

    def install(self) -> None:
        """Patch the modules imported already (a zygote preloads some), and the others when
        they are imported; a second finder of the same class is not added."""
        for name in self.names:
            if name in sys.modules:
                self.patch(sys.modules[name])
        if not any(type(finder) is type(self) for finder in sys.meta_path):
            sys.meta_path.insert(0, self)
