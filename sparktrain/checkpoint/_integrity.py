"""Whether one committed checkpoint is intact: its data matches its commit marker.

``load_latest`` and ``save(keep_last=…)`` both decide with :func:`verify`, so a checkpoint
that retention counts is one that ``load_latest`` would load.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from sparktrain.checkpoint._store import _Store
from sparktrain.checkpoint.layout import MalformedMarker, marker_name, parse_marker

_CHUNK = 1 << 20

Kind = Literal["damaged", "vanished", "unreadable"]


class Unusable(Exception):
    """Why one checkpoint cannot be used; turned into a warning.

    Attributes:
        kind: ``"damaged"``: proven unloadable (its marker is not valid, or its data is
            missing, or differs in size or SHA-256 from what its marker records).
            ``"vanished"``: its files were deleted while being read; a concurrent save pruned
            it, so a newer checkpoint exists and the directory is worth listing again.
            ``"unreadable"``: an I/O error hid its content; it may well be intact.
    """

    def __init__(self, message: str, kind: Kind = "damaged") -> None:
        super().__init__(message)
        self.kind: Kind = kind

    @property
    def vanished(self) -> bool:
        """Whether its files were deleted while being read."""
        return self.kind == "vanished"


def verify(store: _Store, step: int) -> str:
    """Check the commit marker of ``step`` and its data; return the data file's name.

    Raises:
        Unusable: the checkpoint cannot be used, and why.
    """
    try:
        _, data, size, digest, files = parse_marker(store.read(marker_name(step)), step)
    except FileNotFoundError:
        raise Unusable("the commit marker vanished while being read", "vanished") from None
    except MalformedMarker as exc:
        raise Unusable(str(exc)) from None
    except OSError as exc:
        raise Unusable(f"the commit marker is unreadable ({exc})", "unreadable") from None
    except ValueError as exc:
        raise Unusable(f"the commit marker is unreadable ({exc})") from None
    try:
        if files is None:
            _check(store, data, size, digest)
        else:
            folder = store.sub(data)
            for name, (size, digest) in sorted(files.items()):
                _check(folder, name, size, digest)
    except FileNotFoundError as exc:
        kind: Kind = "damaged" if store.exists(marker_name(step)) else "vanished"
        raise Unusable(f"its data file {exc.filename} is missing", kind) from None
    except OSError as exc:
        raise Unusable(
            f"its data file {exc.filename} cannot be read ({exc})", "unreadable"
        ) from None
    return data


def _check(store: _Store, name: str, size: int, digest: str) -> None:
    """Check one data file's size and SHA-256 against its commit marker's record.

    Raises:
        Unusable: they differ.
        OSError: it cannot be read (``filename`` is its URL); FileNotFoundError: it is missing.
    """
    url = store.url(name)
    try:
        actual = store.size(name)
        if actual != size:
            raise Unusable(
                f"{url} is truncated or altered: {actual} bytes, its commit marker records {size}"
            )
        sha256 = hashlib.sha256()
        with store.open(name) as f:
            while chunk := f.read(_CHUNK):
                sha256.update(chunk)
    except OSError as exc:
        exc.filename = url
        raise
    if sha256.hexdigest() != digest:
        raise Unusable(f"{url} is corrupted: its SHA-256 differs from the one in its commit marker")
