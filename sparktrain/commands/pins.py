"""``sparktrain constraints``: the versions this release's tests ran with, for ``pip -c``."""

from __future__ import annotations

from importlib import resources


def tested_constraints() -> str:
    """The pip constraints file shipped in the package (``torch`` pins the CPU build's version).

    Example:
        >>> "torch==" in tested_constraints()
        True
    """
    return resources.files("sparktrain").joinpath("constraints.txt").read_text(encoding="utf-8")
