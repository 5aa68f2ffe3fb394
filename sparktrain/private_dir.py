"""The one folder per user where sparktrain keeps its files on a host.

Kept results, task folders, the default data cache and anything else sparktrain writes under
the temporary folder live in ``<tempfile.gettempdir()>/sparktrain-<uid>``, mode 0700. Hosts are
shared (YARN and standalone executors of several tenants, JupyterHub drivers, containers that
share ``/tmp``), so the folder is used only when ``lstat`` shows a real directory (not a link)
owned by this uid that no one else can read, write or enter; anything else is an error that
names the folder, its owner and mode, and the way out (``TMPDIR``).

Why there:

* ``tempfile.gettempdir()`` follows ``TMPDIR``, the one setting every launcher (spark-submit,
  YARN's container launch, JupyterHub spawners, ``docker run -e``) already knows how to pass,
  so a user who finds the folder taken points sparktrain elsewhere without a new setting.
* ``$XDG_RUNTIME_DIR`` is private by construction, but exists only in a logind login session:
  Spark executors, YARN containers, cron jobs and most containers have none. It is a small
  tmpfs (10% of memory by default) removed at logout, so it would lose a kept result when a
  notebook user logs out and cannot hold a data cache.
* Spark's local dirs (``spark.local.dir``, YARN's ``LOCAL_DIRS``) belong to one application
  and are removed when it ends, which is exactly when a result is kept (the driver is gone);
  the driver and ``np < 0`` runs have no Spark at all.

Another account can take the folder's name first (a ``mkdir`` in ``/tmp``). That must not stop
its user's runs: :func:`usable_root` and :func:`usable_folder` then use a folder of a fresh
random name beside it (``sparktrain-<uid>-alt-XXXXXXXX``, made by :func:`tempfile.mkdtemp`,
0700, created exclusively), reused by later runs when ``lstat`` shows it is still this user's
alone, and log a warning naming the squatter (owner, mode) and how to free the name.

Files inside are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (or :func:`tempfile.mkstemp`),
so even a name known in advance cannot be planted or redirected.
"""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from pathlib import Path

from sparktrain.errors import ConfigurationError
from sparktrain.log import get_logger

_log = get_logger(__name__)

PREFIX = "sparktrain-"
# A fallback folder's name after ``PREFIX<uid>``; never the private folder's own name.
FALLBACK_INFIX = "-alt-"
# Entries of the temporary folder looked at when looking for a fallback folder to reuse.
_MAX_SCAN = 10_000

# Create only, never truncate or follow a link; not inherited by processes this one starts.
EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotPrivateError(ConfigurationError):
    """A folder sparktrain would keep its files in is not this user's alone.

    Attributes:
        taken: the folder exists and is not fit for use (someone else's, a link, open to
            others): a fresh folder beside it would do. False where no folder in that parent
            could be private (a parent others can write without the sticky bit) or none can
            be made there.
    """

    def __init__(self, message: str, taken: bool = False) -> None:
        super().__init__(message)
        self.taken = taken


def root(parent: str | os.PathLike[str] | None = None) -> Path:
    """This user's private folder on this host, created (mode 0700) when missing.

    Args:
        parent: the folder to make it in; default the temporary folder (``TMPDIR``).

    Raises:
        NotPrivateError: it exists and is not a directory of this user's alone, or its
            parent lets others replace it.
    """
    base = Path(parent if parent is not None else tempfile.gettempdir())
    _check_parent(base)
    return ensure(base / f"{PREFIX}{os.getuid()}")


def folder(name: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """``root()/name``, created (0700) or checked like :func:`root`."""
    return ensure(root(parent) / name)


def ensure(path: Path) -> Path:
    """``path`` as a directory of this user's alone: made 0700 if missing, else checked.

    Raises:
        NotPrivateError: it exists and is a link, not a directory, someone else's, or open
            to the group or others.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise NotPrivateError(
            f"sparktrain cannot create its private folder {path} ({exc}); {_WAY_OUT}"
        ) from exc
    check(path)
    return path


def check(path: Path) -> None:
    """Refuse ``path`` unless ``lstat`` shows a directory owned by this uid, mode ``0?00``.

    Raises:
        NotPrivateError: naming the path, its owner and mode, and the way out.
    """
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise NotPrivateError(f"sparktrain cannot check its folder {path} ({exc})") from exc
    what = _problem(info)
    if what:
        raise NotPrivateError(
            f"{path} is {what} (owner {describe_owner(info.st_uid)}, mode "
            f"{stat.filemode(info.st_mode)} {oct(info.st_mode & 0o7777)}): sparktrain keeps "
            f"its files on a host only in a folder of yours that no one else can read or "
            f"write. Remove it if it is yours, or ask its owner or an administrator to; or "
            f"{_WAY_OUT}",
            taken=True,
        )


_WAY_OUT = (
    "set TMPDIR (for the driver, and with spark.executorEnv.TMPDIR for the executors) to a "
    "folder of your own"
)


def _problem(info: os.stat_result) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if info.st_uid != os.getuid():
        return "not yours"
    if info.st_mode & 0o077:
        return "open to other accounts"
    return ""


def _check_parent(base: Path) -> None:
    """A parent others can write must be sticky, or they could rename our folder away."""
    try:
        info = os.stat(base)
    except OSError as exc:
        raise NotPrivateError(
            f"the temporary folder {base} cannot be used ({exc}); {_WAY_OUT}"
        ) from exc
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise NotPrivateError(
            f"the temporary folder {base} is writable by others without the sticky bit "
            f"(mode {oct(info.st_mode & 0o7777)}), so another account could replace "
            f"sparktrain's folder in it; chmod +t it, or {_WAY_OUT}"
        )


def usable_root(parent: str | os.PathLike[str] | None = None) -> Path:
    """:func:`root`, or where its name is taken, a fallback folder of this user's beside it.

    Raises:
        NotPrivateError: no private folder can be had in ``parent`` at all (see
            :attr:`NotPrivateError.taken`).
    """
    try:
        return root(parent)
    except NotPrivateError as exc:
        if not exc.taken:
            raise
        found = fallback(parent)
        _log.warning(
            "sparktrain uses %s for its files on this host, as its own folder cannot be used: %s",
            found,
            exc,
        )
        return found


def usable_folder(name: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """``usable_root()/name``, created (0700) or checked like :func:`root`."""
    return ensure(usable_root(parent) / name)


def fallback(parent: str | os.PathLike[str] | None = None) -> Path:
    """A folder of this user's alone beside the private folder: one made before, if ``lstat``
    still shows it so, else a new one of random name.

    Raises:
        NotPrivateError: none can be made.
    """
    base = Path(parent if parent is not None else tempfile.gettempdir())
    _check_parent(base)
    prefix = f"{PREFIX}{os.getuid()}{FALLBACK_INFIX}"
    for path in fallbacks(base):
        try:
            check(path)
        except NotPrivateError:
            continue  # someone else's, under a name like ours: never used
        return path
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    except OSError as exc:
        raise NotPrivateError(
            f"sparktrain cannot create a private folder in {base} ({exc}); {_WAY_OUT}"
        ) from exc


def fallbacks(base: Path) -> list[Path]:
    """The entries of ``base`` named like this user's fallback folders, in name order
    (not checked: see :func:`check`)."""
    prefix = f"{PREFIX}{os.getuid()}{FALLBACK_INFIX}"
    names: list[str] = []
    try:
        with os.scandir(base) as entries:
            for count, entry in enumerate(entries):
                if count >= _MAX_SCAN:
                    break
                if entry.name.startswith(prefix):
                    names.append(entry.name)
    except OSError:
        return []
    return [base / name for name in sorted(names)]


def describe_owner(uid: int) -> str:
    """``name (uid)``, or the bare uid where the account has no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def write_new(folder_path: Path, name: str, data: bytes | bytearray) -> Path:
    """Write ``folder_path/name`` whole or not at all, through an unpredictable temp name.

    Returns:
        The path written.

    Raises:
        OSError: it could not be written; no partial file is left.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder_path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        path = folder_path / name
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
