"""``horovod.torch`` on a rank that uses sparktrain's built-in implementation.

Everything comes from :mod:`sparktrain.hvdcompat.api` (``horovod.torch.elastic`` is the
subpackage here, loaded on first use); Horovod functions it does not provide raise
NotImplementedError naming themselves.
"""

import importlib
from typing import Any

from sparktrain.hvdcompat import api as _api
from sparktrain.hvdcompat.api import *  # noqa: F403 - this module is that API
from sparktrain.hvdcompat.api import __all__  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _api.LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return _api.__getattr__(name)
