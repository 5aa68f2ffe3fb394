"""Horovod's ``horovod.torch`` API implemented on torch.distributed, for ranks without Horovod.

:mod:`sparktrain.hvdcompat.api` is the implementation. The folder :data:`SHIM_DIR` holds a
package named ``horovod`` that re-exports it; the worker puts that folder first on a rank's
``sys.path`` when the Horovod backend picks the built-in implementation, so that training
code's ``import horovod.torch as hvd`` runs unchanged. Nothing else ever sees the shim: the
driver, the user's notebook and other backends' ranks import the real Horovod, if any.

This module imports neither torch nor Horovod, so the worker can locate the shim cheaply.
"""

from __future__ import annotations

from sparktrain import contract

# The folder placed first on a rank's sys.path: it holds the ``horovod`` shim package (spelled
# in contract, where the worker, which hvdcompat's elastic API imports, finds it).
SHIM_DIR = contract.HOROVOD_SHIM_DIR

__all__ = ["SHIM_DIR"]
