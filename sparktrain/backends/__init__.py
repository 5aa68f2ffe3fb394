"""Backends wire the ranks together; they are looked up by name, never branched on."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparktrain.backends.base import Backend

# name -> "module:Class"; modules are imported only when their backend is used.
_REGISTRY: dict[str, str] = {
    "torch": "sparktrain.backends.torch:TorchBackend",
    "horovod": "sparktrain.backends.horovod:HorovodBackend",
}


def backend_names() -> tuple[str, ...]:
    """Names of the registered backends."""
    return tuple(_REGISTRY)


def get_backend(name: str) -> Backend:
    """An instance of the backend registered as ``name``.

    Raises:
        KeyError: for an unknown name (RunConfig rejects those first).
    """
    module_name, _, cls_name = _REGISTRY[name].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    backend: Backend = cls()
    return backend
