"""Pickling what crosses from the driver to the ranks and back, with limits and clear errors."""

from __future__ import annotations

import errno
import io
import os
import pickle
import stat
import struct
import types
from collections import ChainMap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from sparktrain import private_dir
from sparktrain.errors import PayloadError
from sparktrain.shipping import module_copies
from sparktrain.shipping.culprit import culprit, type_name
from sparktrain.shipping.kept import LIFETIME
from sparktrain.shipping.local_modules import Scope, imports_in_code

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _code_with_filename(
    rebuild: Callable[..., types.CodeType], args: tuple[Any, ...], filename: str
) -> types.CodeType:
    """Rebuild a pickled code object and give it back the file it was compiled from."""
    return rebuild(*args).replace(co_filename=filename)


def _reduce_code(code: types.CodeType) -> tuple[Any, ...]:
    """cloudpickle's reduction of a code object, keeping its file name.

    From cloudpickle 3.1.3 on, every code object pickled by value is rebuilt with the file
    name ``<dynamic-code>`` (for payloads that do not depend on where a function was defined),
    so a rank's traceback and stack dump would say ``File "<dynamic-code>", line 39`` instead
    of naming the user's file. The file name travels beside the code instead; with a
    cloudpickle that keeps it, the reduction is left as it is.
    """
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    if code.co_filename in args:
        return rebuild, args
    return _code_with_filename, (rebuild, args, code.co_filename)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with code objects that keep their file names."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


class _Recorder(_Pickler):
    """:class:`_Pickler` that notes the modules what it pickles comes from or imports."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self.modules.add(obj.__name__)
        elif isinstance(obj, (type, types.FunctionType)):
            name = getattr(obj, "__module__", None)
            if isinstance(name, str):
                self.modules.add(name)
        elif isinstance(obj, types.CodeType):  # code pickled by value: its imports
            self.modules.update(imports_in_code(obj))
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` as cloudpickle does, functions by value keeping their files and lines.

    Args:
        obj: what to pickle (a function, its arguments, a result).

    Returns:
        The pickle, which :func:`cloudpickle.loads` (or :func:`pickle.loads`, where sparktrain
        is importable) reads back.
    """
    with io.BytesIO() as buffer:
        _Pickler(buffer, protocol=_PROTOCOL).dump(obj)
        return buffer.getvalue()


def _mib(n: int) -> str:
    """A size for a message: in MiB, or in bytes where MiB would round it to nothing."""
    return f"{n / (1 << 20):.1f} MiB" if n >= 100 << 10 else f"{n} bytes"


def _fails(obj: Any) -> Exception | None:
    try:
        dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is what we look for
        return exc
    return None


def dump_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    limit: int,
    modules: Scope | None = None,
) -> bytes:
    """Pickle the training function and its arguments on the driver.

    The payload is the pickle of ``(fn, args, kwargs)``, then the pickle of the modules that
    travel with it (``{relative path: source}``, see :mod:`sparktrain.shipping.local_modules`),
    then where that second pickle starts (8 bytes): :func:`load_call` writes the modules
    before it unpickles the call, which may name their functions and classes.

    Args:
        fn: the function every rank runs.
        args: its positional arguments.
        kwargs: its keyword arguments.
        limit: the most bytes the pickle of the call may take.
        modules: where the user's modules that travel are looked for; None sends none.

    Raises:
        PayloadError: when something cannot be pickled (naming the captured object), the
            pickle exceeds ``limit`` bytes, or the modules exceed theirs (naming them).
    """
    if not callable(fn):
        raise PayloadError(f"run() needs a function to run on each rank; got {type_name(fn)}")
    buffer = io.BytesIO()
    pickler = _Recorder(buffer)
    try:
        pickler.dump((fn, tuple(args), dict(kwargs)))
    except Exception as exc:  # noqa: BLE001 - re-raised with the culprit named
        named = culprit(fn, tuple(args), kwargs, _fails)
        where = f" The culprit is {named}." if named else ""
        raise PayloadError(
            f"cannot send {getattr(fn, '__name__', fn)!r} to the ranks: {type(exc).__name__}: "
            f"{exc}.{where} Create such objects inside the function (locks, clients, "
            "SparkContext/SparkSession cannot cross to another process), or pass what is "
            "needed to build them as arguments."
        ) from exc
    size = buffer.tell()
    if size > limit:
        raise PayloadError(
            f"the pickled function and arguments take {_mib(size)}, over the limit of "
            f"{_mib(limit)} (max_payload_bytes / spark.sparktrain.maxPayloadBytes). Pass large "
            "data as a path or a Spark DataFrame converter instead of capturing it."
        )
    files = modules.files(pickler.modules) if modules is not None else {}
    pickle.dump(files, buffer, protocol=_PROTOCOL)
    buffer.write(_OFFSET.pack(size))
    return buffer.getvalue()


# Where the modules' pickle starts, at the end of a payload.
_OFFSET = struct.Struct("<Q")


def _split(data: bytes | bytearray | memoryview) -> tuple[memoryview, memoryview]:
    """A payload's two pickles: the call's, the modules'."""
    view = memoryview(data)
    if len(view) < _OFFSET.size:
        raise PayloadError(f"the run's payload is cut short ({len(view)} bytes)")
    (start,) = _OFFSET.unpack(view[-_OFFSET.size :])
    if start > len(view) - _OFFSET.size:
        raise PayloadError("the run's payload is not one sparktrain made (its modules' offset)")
    return view[:start], view[start : -_OFFSET.size]


def shipped_modules(data: bytes | bytearray) -> dict[str, bytes]:
    """The modules that travel in a payload :func:`dump_call` made: ``{path: source}``."""
    files: dict[str, bytes] = pickle.loads(_split(data)[1])
    return files


def load_call(
    data: bytes | bytearray, folder: str | os.PathLike[str] | None = None
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`dump_call`, on a rank: the modules that travelled are written into
    a new folder inside ``folder`` (default: the private folder) and put on ``sys.path``
    first (see :mod:`sparktrain.shipping.module_copies`), then the call is unpickled."""
    call, modules = _split(data)
    files = pickle.loads(modules)
    if files:
        module_copies.install(files, folder if folder is not None else private_dir.usable_root())
    fn, args, kwargs = cloudpickle.loads(call)
    return fn, args, kwargs


class ResultTooLargeError(PayloadError):
    """A rank's result pickled, but to more than the limit.

    Attributes:
        data: the pickle, so that it can be kept rather than lost.
    """

    def __init__(self, message: str, data: bytes) -> None:
        super().__init__(message)
        self.data = data


def dump_result(value: Any, limit: int, rank: int = 0) -> bytes:
    """Pickle a rank's return value.

    Args:
        value: what the function returned.
        limit: the most bytes its pickle may have.
        rank: the rank that returned it, for the errors.

    Raises:
        PayloadError: if it cannot be pickled.
        ResultTooLargeError: if its pickle exceeds ``limit`` bytes.
    """
    try:
        data = dumps(value)
    except Exception as exc:  # noqa: BLE001 - re-raised with context
        raise PayloadError(
            f"rank {rank} returned a {type_name(value)} that cannot be pickled "
            f"({type(exc).__name__}: {exc}); return plain data (numbers, dicts, tensors, "
            "a state_dict) instead"
        ) from exc
    if len(data) > limit:
        raise ResultTooLargeError(
            f"rank {rank}'s return value pickles to {_mib(len(data))}, over the limit of "
            f"{_mib(limit)} (max_result_bytes / spark.sparktrain.maxResultBytes); save large "
            "results to storage (e.g. sparktrain.checkpoint.save) and return the path",
            data,
        )
    return data


def load_result(data: bytes | bytearray) -> Any:
    """Inverse of :func:`dump_result`, on the driver."""
    return cloudpickle.loads(data)


KEPT_RESULTS = "results"


def keep_result(data: bytes | bytearray, name: str, folder: str | None = None) -> Path:
    """Write a result that could not be returned where its owner can load it later.

    It goes to ``<private folder>/results/<name>.pkl`` (see :mod:`sparktrain.private_dir`),
    readable by its owner alone, written whole or not at all through an unpredictable temporary
    name, so no other account can read it, plant it, or redirect the write.

    Args:
        data: the pickle.
        name: the file's name, without ``.pkl``.
        folder: where to make the private folder instead of the temporary folder.

    Returns:
        The file's path; :func:`load_kept` gives the value back.

    Raises:
        OSError: it could not be written (the message says where and why).
        NotPrivateError: the private folder is not this user's alone.
    """
    return private_dir.write_new(private_dir.folder(KEPT_RESULTS, folder), f"{name}.pkl", data)


def load_kept(path: str | os.PathLike[str]) -> Any:
    """Load a result that sparktrain kept on this host (the path its error message gave).

    Unpickling runs code, so the file is read only if no other account could have written
    it, judged on what is actually opened: its folder is opened once (a directory owned by
    the caller or root that no one else can write) and the file is opened inside that very
    folder without following a link or blocking, then must be a regular file owned by the
    caller, writable by no one else, with no second name (a hard link another account made
    keeps the file's owner and could be written through later).

    Example:
        >>> state = sparktrain.load_kept("/tmp/sparktrain-1000/results/ab12-attempt1-rank0.pkl")

    Raises:
        PayloadError: the file is not safe to load, naming why.
        OSError: it cannot be read.
    """
    path = os.fspath(path)
    parent, name = os.path.split(os.path.abspath(path))
    dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        folder_info = os.fstat(dir_fd)
        if folder_info.st_uid not in (os.getuid(), 0) or folder_info.st_mode & 0o022:
            raise PayloadError(
                f"refusing to load {path}: its folder {parent} can be written by "
                f"{private_dir.describe_owner(folder_info.st_uid)} or others (mode "
                f"{oct(folder_info.st_mode & 0o7777)}), so another account could have "
                "replaced the file, and unpickling it would run their code as you"
            )
        try:
            fd = os.open(name, _READ_KEPT, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PayloadError(
                    f"refusing to load {path}: it is a symbolic link, not a file sparktrain kept"
                ) from exc
            raise
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        what = _kept_problem(os.fstat(fh.fileno()))
        if what:
            raise PayloadError(
                f"refusing to load {path}: it is {what}, not a result sparktrain kept for you; "
                "unpickling it would run another account's code as you"
            )
        return pickle.loads(fh.read())


# Never follow a link, never block (a FIFO in the file's place is refused, not waited on).
_READ_KEPT = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _kept_problem(info: os.stat_result) -> str:
    """Why an opened file is not one only its owner could have written, or ""."""
    if not stat.S_ISREG(info.st_mode):
        return f"not a regular file ({stat.filemode(info.st_mode)})"
    if info.st_uid != os.getuid():
        return f"owned by {private_dir.describe_owner(info.st_uid)}"
    if info.st_mode & 0o022:
        return (
            f"writable by {'others' if info.st_mode & 0o002 else 'its group'} (mode "
            f"{oct(info.st_mode & 0o7777)})"
        )
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} names (hard links), one of which may not be yours"
    return ""


def kept_result_name(run_id: str, attempt: int, rank: int = 0) -> str:
    """The name :func:`keep_result` gives ``rank``'s result of ``attempt`` (0-based) of a run."""
    return f"{run_id}-attempt{attempt + 1}-rank{rank}"


def keep_and_say(data: bytes | bytearray, name: str, host: str | None = None) -> str:
    """Keep a result that cannot be returned; the end of the error that says where, how to
    read it back, and how long it stays (see :mod:`sparktrain.shipping.kept`).

    Args:
        data: the pickled result.
        name: see :func:`keep_result`.
        host: the machine this runs on, when the error is read elsewhere.
    """
    on = f" on {host}" if host else ""
    note = ""
    try:
        try:
            path = keep_result(data, name)
        except private_dir.NotPrivateError as exc:
            # Someone else holds the private folder's name: a folder of this user's alone
            # beside it (see private_dir.fallback) still keeps the result from being lost.
            fallback = private_dir.ensure(private_dir.fallback() / KEPT_RESULTS)
            path = private_dir.write_new(fallback, f"{name}.pkl", data)
            note = f"; the private folder could not be used: {exc}"
    except (OSError, private_dir.NotPrivateError) as exc:
        return f"it could not be kept{on} either ({exc}{note})"
    return f"it is kept in {path}{on} (sparktrain.load_kept(path) reads it back; {LIFETIME}{note})"
