"""Which Horovod a run's ranks get: an installed ``horovod.torch``, found without importing
torch or Horovod, or sparktrain's built-in one (:mod:`sparktrain.hvdcompat`) and why."""

from __future__ import annotations

import importlib.util
import mmap
from pathlib import Path
from typing import Any

from sparktrain.config import RunConfig, conf_key

INSTALL_HINT = (
    "Horovod with PyTorch support is needed for backend='horovod'. Horovod 0.28.1 does not "
    "build as-is against torch >= 2.1: run `sparktrain install-horovod` (it builds it with "
    "Gloo, and MPI when Open MPI is installed, in ~12 min on 2 cores), or build it yourself with HOROVOD_WITH_PYTORCH=1 "
    "HOROVOD_WITH_GLOO=1 and a C++17 compiler: pip install --no-build-isolation horovod. "
    "On a Spark cluster it must be installed in the executors' Python environment too. "
    "Or use backend='torch'."
)


def _horovod_spec() -> Any:
    return installed_horovod()


def installed_horovod() -> Any:
    """The module spec of an installed Horovod, or None (not installed, or only the driver's
    stand-in that ``sparktrain-horovod.pth`` provides, see ``_sparktrain_horovod``)."""
    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):  # an import hook that hides it, or a broken install
        return None
    if spec is not None and type(spec.loader).__module__ == "_sparktrain_horovod":
        return None
    return spec


def horovod_torch_library() -> Path | None:
    """The installed ``horovod.torch`` extension, found without importing torch or Horovod.

    Returns:
        The path of ``horovod/torch/mpi_lib_v2*.so``, or ``None`` when Horovod is not
        installed or was built without PyTorch.
    """
    spec = _horovod_spec()
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for lib in sorted(Path(location, "torch").glob("mpi_lib_v2*")):
            return lib
    return None


def _links_mpi(library: Path) -> bool:
    """Whether a Horovod extension was linked against an MPI library."""
    try:
        with library.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"libmpi") >= 0
    except (OSError, ValueError):
        return True  # cannot tell: let hvd.init() say


def builtin_reason(config: RunConfig) -> str | None:
    """Why the ranks use sparktrain's built-in ``horovod.torch``, or None when they use Horovod.

    ``horovod_impl="auto"`` picks the built-in one when this process finds no usable
    ``horovod.torch`` (on a Spark cluster, rank 0's task decides for every rank).
    """
    if config.horovod_impl == "builtin":
        return f"chosen by horovod_impl='builtin' ({conf_key('horovod_impl')})"
    if config.horovod_impl == "horovod" or config.launcher == "mpi":
        return None
    if _horovod_spec() is None:
        return "Horovod is not installed"
    if horovod_torch_library() is None:
        return "Horovod is installed without horovod.torch"
    return None
