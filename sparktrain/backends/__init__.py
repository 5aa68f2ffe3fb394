"""Backends wire the ranks together; they are looked up by name, never branched on.

The registry is also where a backend name is checked: :class:`~sparktrain.config.RunConfig`
holds the name as given, and :func:`check_backend_name` (called by the runner at
construction) or :func:`get_backend` refuses a name that is not registered.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sparktrain.config import conf_key
from sparktrain.errors import ConfigurationError

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


def check_backend_name(name: str) -> None:
    """Refuse a backend name that is not registered, without importing any backend.

    Args:
        name: the ``backend`` setting (argument ``backend=``, or ``spark.sparktrain.backend``).

    Raises:
        ConfigurationError: naming the registered backends and the setting to change.
    """
    if name not in _REGISTRY:
        raise ConfigurationError(
            f"unknown backend {name!r}; choose one of {', '.join(backend_names())} "
            f"(argument backend=, or {conf_key('backend')})"
        )


def get_backend(name: str) -> Backend:
    """An instance of the backend registered as ``name``.

    Raises:
        ConfigurationError: for an unknown name (see :func:`check_backend_name`).
    """
    check_backend_name(name)
    module_name, _, cls_name = _REGISTRY[name].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    backend: Backend = cls()
    return backend
