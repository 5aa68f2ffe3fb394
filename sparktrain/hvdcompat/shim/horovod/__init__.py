"""sparktrain's stand-in for the ``horovod`` package, on a rank's path only (see
:mod:`sparktrain.hvdcompat`). Only ``horovod.torch`` is provided."""

import os
import sys

from sparktrain import contract

__version__ = "0.28.1+sparktrain"

# The one line that tells a rank's log which Horovod it got (and why).
sys.stderr.write(
    "sparktrain: horovod.torch here is sparktrain's built-in implementation on "
    f"torch.distributed ({os.environ.get(contract.HOROVOD_SHIM_ENV, 'chosen by sparktrain')})\n"
)
sys.stderr.flush()
