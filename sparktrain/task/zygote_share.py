"""Where an executor's warm zygote is found by the executor's later Python workers.

A zygote (:mod:`sparktrain.task.zygotes`) started by one Python worker of an executor would
end with that worker. Spark does not keep a worker for ever: idle ones are stopped after a
minute, and from a Spark Connect session another job's task (TorchDistributor's, say) can
take the worker that holds the zygote and end it. So a zygote started in an executor, once
loaded, also listens on a Unix socket at :func:`share_path`: the executor's next worker whose
ranks have the same environment joins it instead of starting cold. It ends with the
executor's Python daemon (the workers' parent, watched through a pidfd), a few minutes after
its last owner went away when no other came (so the zygotes of environments no longer used do
not pile up), or after its idle time.

The socket lives in this user's private folder (0700, :mod:`sparktrain.private_dir`), so no
other account can reach a zygote or plant a false one; both ends also check the other's uid
(``SO_PEERCRED``). A path too long for a socket's name (a deep ``TMPDIR``) is reached through
``/proc/self/fd`` and a descriptor of its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

from sparktrain import private_dir
from sparktrain.log import get_logger

_log = get_logger(__name__)

# What a rank depends on while it loads: interpreter, folder, early variables (see import_key).
Key = tuple[str, str, tuple[tuple[str, str], ...]]

# The folder (in the private one) where an executor's zygotes take its workers as owners.
SHARE_FOLDER = "zygotes"


def share_path(key: Key, anchor: int) -> str | None:
    """Where the zygote for ``key`` of the executor whose Python daemon is ``anchor`` takes
    the executor's Python workers as owners; None where there is no such place.

    In this user's private folder (0700), so no other account can reach it or plant one;
    None where that folder cannot be had.
    """
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    try:
        folder = private_dir.usable_folder(SHARE_FOLDER)
    except (OSError, private_dir.NotPrivateError) as exc:
        _log.debug("zygotes are not shared: %s", exc)
        return None
    _forget_ended(folder)
    return os.path.join(folder, f"{anchor}-{digest}")


def _forget_ended(folder: str | os.PathLike[str]) -> None:
    """Remove the names left by zygotes whose executor has ended (a zygote killed outright)."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            anchor, _, _ = entry.name.partition("-")
            if not anchor.isdigit():
                continue
            try:
                os.kill(int(anchor), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            except PermissionError:
                continue
