"""``horovod.torch`` on a rank that uses sparktrain's built-in implementation.

Everything comes from :mod:`sparktrain.hvdcompat.api`; Horovod functions it does not provide
raise NotImplementedError naming themselves.
"""

from sparktrain.hvdcompat.api import *  # noqa: F403 - this module is that API
from sparktrain.hvdcompat.api import __all__, __getattr__  # noqa: F401
