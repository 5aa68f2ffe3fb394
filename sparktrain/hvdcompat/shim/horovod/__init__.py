"""sparktrain's stand-in for the ``horovod`` package, on a rank's path only (see
:mod:`sparktrain.hvdcompat`). ``horovod.torch`` is provided, with the parts of
``horovod.common`` that elastic scripts import (``exceptions``, ``elastic``)."""

import os
import sys

from sparktrain import contract

__version__ = "0.28.1+sparktrain"

# The one line that tells which Horovod the ranks got (and why): rank 0 says it on the driver,
# whatever the log verbosity (HorovodRunner's default shows no rank output); the other ranks
# would only repeat it. Outside a run it goes to this process's stderr.
_NOTICE = (
    "sparktrain: horovod.torch here is sparktrain's built-in implementation on "
    f"torch.distributed ({os.environ.get(contract.HOROVOD_SHIM_ENV, 'chosen by sparktrain')})"
)
if os.environ.get("RANK", "0") == "0":
    from sparktrain.worker.context import tell_driver

    if not tell_driver(_NOTICE):
        sys.stderr.write(_NOTICE + "\n")
        sys.stderr.flush()
