"""Checks hooked into the training frameworks a rank's function imports, once it imports them.

Lightning decides each process's device from ``LOCAL_RANK`` and the ``devices`` the user gave
its ``Trainer``; where those disagree with the layout sparktrain started, Lightning fails deep
inside (``IndexError: list index out of range`` on one rank, while the others wait for it).
The check here runs where Lightning starts its strategy, on every rank, and says instead what
the layout is and what to write.

Nothing is imported up front (Lightning takes seconds to import): a finder on ``sys.meta_path``
wraps Lightning's launcher module when the function itself imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sparktrain.errors import ConfigurationError
from sparktrain.worker.import_hooks import PatchOnImport

# Lightning's launcher for processes started outside it (torchrun, sparktrain), under each
# of the names the package is installed as.
LAUNCHER_MODULES = frozenset(
    f"{package}.strategies.launchers.subprocess_script"
    for package in (
        "lightning.pytorch",
        "pytorch_lightning",
        "lightning.fabric",
        "lightning_fabric",
    )
)
LAUNCHER_CLASS = "_SubprocessScriptLauncher"
_CHECKED = "_sparktrain_checked"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def layout_problem(devices: int, num_nodes: int) -> str | None:
    """Why ``Trainer(devices=devices, num_nodes=num_nodes)`` cannot run in this rank's layout.

    Args:
        devices: Lightning's processes per node (``len(parallel_devices)``).
        num_nodes: Lightning's ``num_nodes``.

    Returns:
        The explanation naming what to write, or None when the two match the layout.
    """
    world = _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_WORLD_SIZE", 1)
    if devices * num_nodes == world and devices == local:
        return None
    nodes = _env_int("GROUP_WORLD_SIZE", world // local if local and world % local == 0 else 0)
    where = (
        f"{nodes} node(s) of {local} rank(s) each"
        if nodes
        else f"{local} rank(s) on this rank's node, nodes of different sizes"
    )
    host_form = (
        f"Trainer(devices={local}, num_nodes={nodes})" if nodes else "no single Trainer setting"
    )
    return (
        f"Lightning's Trainer(devices={devices}, num_nodes={num_nodes}) asks for "
        f"{devices * num_nodes} process(es), {devices} per node, but sparktrain started "
        f"{world} rank(s): {where} (a node is a host unless SparkRunner's node setting says "
        f"otherwise; this is rank {_env_int('RANK', 0)}, LOCAL_RANK "
        f"{_env_int('LOCAL_RANK', 0)}). Write {host_form} for this layout, or run with "
        f"SparkRunner(..., node='task') and Trainer(devices=1, num_nodes={world}), "
        "TorchDistributor's layout (every Spark task a node of its own)."
    )


def _checked_launch(launch: Callable[..., Any]) -> Callable[..., Any]:
    """``launch`` that first checks the launcher's devices and nodes against the layout."""

    def launch_checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        devices = getattr(self, "num_processes", None)
        num_nodes = getattr(self, "num_nodes", None)
        if isinstance(devices, int) and isinstance(num_nodes, int):
            problem = layout_problem(devices, num_nodes)
            if problem is not None:
                raise ConfigurationError(problem)
        return launch(self, *args, **kwargs)

    setattr(launch_checked, _CHECKED, True)
    launch_checked.__doc__ = launch.__doc__
    return launch_checked


def patch_launcher(module: ModuleType) -> None:
    """Wrap ``launch`` of the launcher class in ``module`` (no-op if Lightning renamed it)."""
    cls = getattr(module, LAUNCHER_CLASS, None)
    launch = getattr(cls, "launch", None)
    if cls is None or launch is None or getattr(launch, _CHECKED, False):
        return
    cls.launch = _checked_launch(launch)


class LightningFinder(PatchOnImport):
    """Wraps Lightning's launcher once one of its launcher modules is imported."""

    def __init__(self) -> None:
        super().__init__(LAUNCHER_MODULES, patch_launcher)


def install() -> None:
    """Check Lightning's layout in this process once it is imported (idempotent).

    A Lightning module imported already (a zygote preloading it) is patched at once.
    """
    LightningFinder().install()
