"""``horovod.torch.elastic``: :mod:`sparktrain.hvdcompat.elastic` under Horovod's name."""

from sparktrain.hvdcompat.elastic import *  # noqa: F403 - this module is that API
from sparktrain.hvdcompat.elastic import __all__  # noqa: F401
