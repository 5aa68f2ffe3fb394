"""Driver side: what a data cache's files were when written, and the check before reusing it.

A cache on shared storage outlives the run that wrote it, and whoever else can write there
could swap a part file (flipped labels, another data set). So the manifest records each part
file's size and SHA-256 at write time (the tasks' writer hashes the bytes as it writes them;
after Spark's writer the driver reads the files back once), and a converter reuses the cache
only when every file still has them. This protects the files, not the manifest: an account
that can rewrite the manifest too can defeat it, which is why the default cache lives in the
user's private folder and a shared one belongs where only its owner can write.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparktrain.data.dataset import is_local
from sparktrain.errors import ConfigurationError

KEY = "integrity"
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
            raise _changed(url, name, "it is not in the manifest's record of what was written")
    sizes = {name: fs.size(posixpath.join(root, name)) for name in names}
    for name in names:
        if sizes[name] != recorded[name][0]:
            raise _changed(
                url, name, f"it has {sizes[name]} bytes, and {recorded[name][0]} were written"
            )
    found = record(fs, root, names)
    for name in names:
        if found[name][1] != recorded[name][1]:
            raise _changed(url, name, "its SHA-256 differs from the one recorded when written")


def _changed(url: str, name: str, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"the data cache {url} was changed after it was written: {name}: {why}. Another "
        f"account or process that can write there may have swapped it, so it is not used. "
        f"Delete {url} to have it written again, and keep the cache where only you can write "
        f"(cache_dir= or spark.sparktrain.data.cacheDir; the default is your private folder)"
    )
