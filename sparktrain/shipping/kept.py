"""Results sparktrain kept on a host because they could not be returned, and their lifetime.

A kept result (see :func:`sparktrain.shipping.payload.keep_and_say`) is a file of its owner's alone in
``<private folder>/results`` (or in a fallback folder, see :mod:`sparktrain.private_dir`). They
would pile up forever, a few hundred MiB each, so each run removes those of its user on its
hosts that are older than ``kept_results_ttl`` (:func:`sweep`, which never fails a run), and
``sparktrain kept list`` / ``sparktrain kept clean`` show and remove them by hand.

Only what ``lstat`` shows to be a regular file of this user's, named ``*.pkl``, in a folder
of this user's alone is listed or removed: nothing is followed, nothing of another account's
is touched.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
import time
from pathlib import Path

from sparktrain import private_dir
from sparktrain.log import get_logger
from sparktrain.units import format_duration

_log = get_logger(__name__)

RESULTS = "results"
SUFFIX = ".pkl"
# Entries of one folder looked at (a folder of someone's alone holds what they kept).
_MAX_ENTRIES = 100_000
# What every message about a kept result says about its lifetime.
LIFETIME = (
    "a run on this host removes it once it is older than kept_results_ttl "
    "(spark.sparktrain.keptResultsTtl, 3 days unless set); `sparktrain kept clean` removes "
    "kept results at once"
)


@dataclasses.dataclass(frozen=True)
class Kept:
    """One kept result: its path, size in bytes and the time it was written."""

    path: Path
    size: int
    written: float


def folders(parent: str | os.PathLike[str] | None = None) -> list[Path]:
    """This user's folders of kept results in ``parent`` (default the temporary folder)
    that ``lstat`` shows are theirs alone: the private folder's, each fallback folder's, and
    the fallback folders of earlier versions (``sparktrain-<uid>-results-*``)."""
    base = Path(parent if parent is not None else tempfile.gettempdir())
    roots = [base / f"{private_dir.PREFIX}{os.getuid()}", *private_dir.fallbacks(base)]
    found = []
    for root in roots:
        try:
            private_dir.check(root)
            private_dir.check(root / RESULTS)
        except private_dir.NotPrivateError:
            continue
        found.append(root / RESULTS)
    earlier = f"{private_dir.PREFIX}{os.getuid()}-results-"
    names = []
    try:
        with os.scandir(base) as entries:
            for count, entry in enumerate(entries):
                if count >= _MAX_ENTRIES:
                    break
                if entry.name.startswith(earlier):
                    names.append(entry.name)
    except OSError:
        pass
    names.sort()
    for name in names:
        try:
            private_dir.check(base / name)
        except private_dir.NotPrivateError:
            continue
        found.append(base / name)
    return found


def listing(parent: str | os.PathLike[str] | None = None) -> list[Kept]:
    """Every kept result of this user's in ``parent``, oldest first."""
    kept = []
    for folder in folders(parent):
        try:
            with os.scandir(folder) as entries:
                for count, entry in enumerate(entries):
                    if count >= _MAX_ENTRIES:
                        break
                    if not entry.name.endswith(SUFFIX) or entry.name.startswith("."):
                        continue
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                        kept.append(Kept(Path(entry.path), info.st_size, info.st_mtime))
        except OSError:
            continue
    return sorted(kept, key=lambda k: (k.written, str(k.path)))


def clean(
    older_than: float | None = None,
    parent: str | os.PathLike[str] | None = None,
    now: float | None = None,
) -> tuple[list[Kept], list[str]]:
    """Remove this user's kept results written ``older_than`` seconds ago or earlier (all of
    them when None).

    Returns:
        The results removed, and a line for each that could not be (never raises for them).
    """
    now = time.time() if now is None else now
    removed, failed = [], []
    for kept in listing(parent):
        if older_than is not None and now - kept.written < older_than:
            continue
        try:
            kept.path.unlink()
        except FileNotFoundError:
            continue  # removed meanwhile, by another run's sweep
        except OSError as exc:
            failed.append(f"{kept.path}: {exc}")
            continue
        removed.append(kept)
    return removed, failed


def sweep(ttl: float | None, parent: str | os.PathLike[str] | None = None) -> list[Kept]:
    """At the start of a run: remove this user's kept results older than ``ttl`` seconds
    (none when ``ttl`` is None). Never raises: a result that cannot be removed stays, and a
    line says why.

    Returns:
        The results removed.
    """
    if ttl is None:
        return []
    try:
        removed, failed = clean(ttl, parent)
    except Exception as exc:  # noqa: BLE001 - cleanup never fails a run
        _log.warning("could not look for kept results older than %s: %s", ttl, exc)
        return []
    if removed:
        _log.info(
            "removed %d kept result(s) older than %s (%s in all; kept_results_ttl)",
            len(removed),
            format_duration(ttl),
            _size(sum(k.size for k in removed)),
        )
    if failed:
        _log.warning(
            "could not remove %d kept result(s) older than %s, e.g. %s",
            len(failed),
            format_duration(ttl),
            failed[0],
        )
    return removed


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 100 << 10 else f"{n} bytes"
