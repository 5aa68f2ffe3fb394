"""The user's modules that travelled with a run, written where the rank imports them.

:mod:`sparktrain.shipping.local_modules` chooses them on the driver. On a rank, before the
function is unpickled (its pickle may name their functions and classes), :func:`install`
writes them into a fresh folder of the rank's own inside its task's private folder (made by
``mkdtemp``: mode 0700 and a name no one can guess in advance; each file created exclusively,
without following a link), and puts that folder first on ``sys.path``, and on ``PYTHONPATH``
for the processes the rank starts. The folder goes with the task's.

A top-level module or package the rank can already import from the very same files (``np <
0``, a shared file system, a host with the same checkout) is left where it is: the files that
travelled of that name are compared with the ones found there, so a package of which only
part travelled never hides the rest of itself, and an older copy on the host (a different
file of the same name) gives way to the driver's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sparktrain import private_dir
from sparktrain.errors import PayloadError


def install(files: Mapping[str, bytes], parent: str | os.PathLike[str]) -> Path | None:
    """Write the modules that travelled where this process imports them.

    Args:
        files: ``{path relative to the import folder: contents}``, as the driver sent them.
        parent: a private folder of this user's to make the copies' folder in.

    Returns:
        The folder put first on ``sys.path``, or None when every module is already
        importable here from the same files.

    Raises:
        PayloadError: a path is not a module's (absolute, ``..``, not ``.py``).
        OSError: the files could not be written.
    """
    groups: dict[str, dict[str, bytes]] = {}
    for rel, data in files.items():
        _check_name(rel)
        top = rel.split("/")[0].removesuffix(".py")
        groups.setdefault(top, {})[rel] = data
    needed = {
        rel: data
        for top, group in groups.items()
        if not _importable_alike(top, group)
        for rel, data in group.items()
    }
    if not needed:
        return None
    folder = Path(tempfile.mkdtemp(prefix="modules-", dir=parent))
    for rel, data in sorted(needed.items()):
        _write(folder, rel, data)
    importlib.invalidate_caches()
    sys.path.insert(0, str(folder))
    earlier = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *([earlier] if earlier else [])])
    return folder


def _check_name(rel: str) -> None:
    parts = rel.split("/")
    *folders, name = parts
    stem = name.removesuffix(".py")
    if stem == name or not stem.isidentifier() or not all(p.isidentifier() for p in folders):
        raise PayloadError(f"the run's modules hold {rel!r}, which is not a module's path")


def _importable_alike(top: str, group: Mapping[str, bytes]) -> bool:
    """Whether ``top`` is importable here from files equal to those that travelled."""
    try:  # every finder this process has (an editable install's too), importing nothing
        spec = importlib.util.find_spec(top)
    except Exception:  # noqa: BLE001 - a finder that fails finds nothing: the copies serve
        return False
    if spec is None or not spec.has_location or not spec.origin:
        return False  # missing, or a namespace package: its portions merge with the copies'
    origin = Path(spec.origin)
    base = origin.parent.parent if spec.submodule_search_locations is not None else origin.parent
    for rel, data in group.items():
        try:
            if (base / rel).read_bytes() != data:
                return False
        except OSError:
            return False
    return True


def _write(folder: Path, rel: str, data: bytes) -> None:
    *folders, name = rel.split("/")
    where = folder
    for part in folders:
        where = where / part
        if not where.is_dir():
            where.mkdir(mode=0o700)
    fd = os.open(where / name, private_dir.EXCLUSIVE, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
