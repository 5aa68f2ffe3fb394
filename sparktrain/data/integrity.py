"""Driver side: what a data cache's files were when written, and the check before reusing it.

A cache on shared storage outlives the run that wrote it, and whoever else can write there
could swap a part file (flipped labels, another data set). So the manifest records each part
file's size and SHA-256, and the converter reuses the cache only when every file still has
them; the ranks check each file again as they read it, and decode only the bytes they hashed
(see :mod:`sparktrain.data.verified`), so a file swapped after the reuse check, or while a
rank reads it, fails the read naming the file.

Where the record comes from: the tasks' writer (``writer="tasks"``) hashes the bytes as it
writes them, in the task that writes them, so the record is of what was written. Spark's own
writer gives no such hook: after its job the driver reads the files back once, so a file
swapped between Spark's write and that read is recorded as it was found. The default cache is
in the user's private folder, where no other account can do that.

This protects the files, not the manifest: an account that can rewrite the manifest too can
defeat it, which is why the default cache lives in the user's private folder and a shared one
belongs where only its owner can write.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparktrain.data.dataset import _DIGESTS_KEY, is_local
from sparktrain.data.verified import changed

KEY = _DIGESTS_KEY
_CHUNK = 1 << 20

# {file name: [size in bytes, SHA-256 hex]}, as stored in the manifest under KEY.
Digests = dict[str, list[Any]]


def digest_file(fs: Any, path: str) -> tuple[int, str]:
    """``(size, SHA-256 hex)`` of one file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    size = 0
    with fs.open(path, "rb") as handle:
        while True:
            piece = handle.read(_CHUNK)
            if not piece:
                break
            digest.update(piece)
            size += len(piece)
    return size, digest.hexdigest()


def record(fs: Any, root: str, names: Sequence[str]) -> Digests:
    """Size and SHA-256 of each file ``names`` under ``root`` (threads for remote stores)."""
    paths = [posixpath.join(root, name) for name in names]
    if len(paths) <= 1 or is_local(fs):
        found = [digest_file(fs, path) for path in paths]
    else:
        with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
            found = list(pool.map(lambda path: digest_file(fs, path), paths))
    return {name: [size, sha] for name, (size, sha) in zip(names, found, strict=True)}


def verify(fs: Any, root: str, url: str, names: Sequence[str], recorded: Mapping[str, Any]) -> None:
    """Refuse a cache whose part files are not the ones written.

    Raises:
        ConfigurationError: naming the first file that is missing from the record, has
            another size, or another SHA-256, and what to do.
    """
    for name in names:
        expected = recorded.get(name)
        if not isinstance(expected, list) or len(expected) != 2:
            raise changed(url, name, "it is not in the manifest's record of what was written")
    sizes = {name: fs.size(posixpath.join(root, name)) for name in names}
    for name in names:
        if sizes[name] != recorded[name][0]:
            raise changed(
                url, name, f"it has {sizes[name]} bytes, and {recorded[name][0]} were written"
            )
    found = record(fs, root, names)
    for name in names:
        if found[name][1] != recorded[name][1]:
            raise changed(url, name, "its SHA-256 differs from the one recorded when written")
