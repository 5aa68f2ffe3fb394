"""Pickling what crosses from the driver to the ranks and back, with limits and clear errors."""

from __future__ import annotations

import dis
import inspect
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from sparktrain.errors import PayloadError

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _captured(fn: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    """Everything a function drags into its pickle: closure cells, globals it names, defaults."""
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, closure, strict=False):
            try:
                yield f"the variable {name!r} captured by {fn.__name__}()", cell.cell_contents
            except ValueError:
                continue
        fn_globals = getattr(fn, "__globals__", {})
        for name in _global_names(code):
            if name in fn_globals and not inspect.ismodule(fn_globals[name]):
                yield f"the global {name!r} used by {fn.__name__}()", fn_globals[name]
    for name, value in (getattr(fn, "__kwdefaults__", None) or {}).items():
        yield f"the default of {name!r} in {getattr(fn, '__name__', fn)}()", value
    for i, value in enumerate(getattr(fn, "__defaults__", None) or ()):
        yield f"default argument #{i} of {getattr(fn, '__name__', fn)}()", value
    bound_self = getattr(fn, "__self__", None)
    if bound_self is not None and not inspect.ismodule(bound_self):
        yield f"the object {type(bound_self).__name__} the method is bound to", bound_self


def _global_names(code: Any) -> Iterator[str]:
    """Names the code loads as globals (co_names also holds attribute names)."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(
            instruction.argval, str
        ):
            yield instruction.argval
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _global_names(const)


def _fails(obj: Any) -> Exception | None:
    try:
        cloudpickle.dumps(obj, protocol=_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is what we look for
        return exc
    return None


def _culprit(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """Name the first piece that cannot be pickled, descending into nested functions."""
    candidates: list[tuple[str, Any]] = [(f"argument #{i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    candidates += list(_captured(fn))
    for where, value in candidates:
        error = _fails(value)
        if error is None:
            continue
        if inspect.isfunction(value) or inspect.ismethod(value):
            inner = _culprit(value, (), {})
            if inner:
                return f"{inner} (reached through {where})"
        return f"{where}, of type {_type_name(value)} ({type(error).__name__}: {error})"
    return ""


def _type_name(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__name__


def dump_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], limit: int
) -> bytes:
    """Pickle the training function and its arguments on the driver.

    Raises:
        PayloadError: when something cannot be pickled (naming the captured object) or the
            pickle exceeds ``limit`` bytes.
    """
    if not callable(fn):
        raise PayloadError(f"run() needs a function to run on each rank; got {_type_name(fn)}")
    try:
        data = cloudpickle.dumps((fn, tuple(args), dict(kwargs)), protocol=_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - re-raised with the culprit named
        culprit = _culprit(fn, tuple(args), kwargs)
        where = f" The culprit is {culprit}." if culprit else ""
        raise PayloadError(
            f"cannot send {getattr(fn, '__name__', fn)!r} to the ranks: {type(exc).__name__}: "
            f"{exc}.{where} Create such objects inside the function (locks, clients, "
            "SparkContext/SparkSession cannot cross to another process), or pass what is "
            "needed to build them as arguments."
        ) from exc
    if len(data) > limit:
        raise PayloadError(
            f"the pickled function and arguments take {_mib(len(data))}, over the limit of "
            f"{_mib(limit)} (max_payload_bytes / spark.sparktrain.maxPayloadBytes). Pass large "
            "data as a path or a Spark DataFrame converter instead of capturing it."
        )
    return data


def load_call(data: bytes) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`dump_call`, on a rank."""
    fn, args, kwargs = cloudpickle.loads(data)
    return fn, args, kwargs


class ResultTooLargeError(PayloadError):
    """Rank 0's result pickled, but to more than the limit.

    Attributes:
        data: the pickle, so that it can be kept rather than lost.
    """

    def __init__(self, message: str, data: bytes) -> None:
        super().__init__(message)
        self.data = data


def dump_result(value: Any, limit: int) -> bytes:
    """Pickle rank 0's return value.

    Raises:
        PayloadError: if it cannot be pickled.
        ResultTooLargeError: if its pickle exceeds ``limit`` bytes.
    """
    try:
        data = cloudpickle.dumps(value, protocol=_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - re-raised with context
        raise PayloadError(
            f"rank 0 returned a {_type_name(value)} that cannot be pickled "
            f"({type(exc).__name__}: {exc}); return plain data (numbers, dicts, tensors, "
            "a state_dict) instead"
        ) from exc
    if len(data) > limit:
        raise ResultTooLargeError(
            f"rank 0's return value pickles to {_mib(len(data))}, over the limit of "
            f"{_mib(limit)} (max_result_bytes / spark.sparktrain.maxResultBytes); save large "
            "results to storage (e.g. sparktrain.checkpoint.save) and return the path",
            data,
        )
    return data


def load_result(data: bytes | bytearray) -> Any:
    """Inverse of :func:`dump_result`, on the driver."""
    return cloudpickle.loads(data)


KEPT_RESULTS = "sparktrain-results"


def keep_result(data: bytes | bytearray, name: str, folder: str | None = None) -> Path:
    """Write a result that could not be returned where its owner can load it later.

    It goes to ``<folder or the temporary folder>/sparktrain-results/<name>.pkl``, readable
    by its owner alone, written whole or not at all.

    Returns:
        The file's path; ``pickle.load(open(path, "rb"))`` gives the value back.

    Raises:
        OSError: it could not be written (the message says where and why).
    """
    base = Path(folder or tempfile.gettempdir()) / KEPT_RESULTS
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = base / f"{name}.pkl"
    tmp = base / f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return path


def kept_result_name(run_id: str, attempt: int) -> str:
    """The name :func:`keep_result` gives rank 0's result of ``attempt`` (0-based) of a run."""
    return f"{run_id}-attempt{attempt + 1}-rank0"


def keep_and_say(data: bytes | bytearray, name: str, host: str | None = None) -> str:
    """Keep a result that cannot be returned; the end of the error that says where.

    Args:
        data: the pickled result.
        name: see :func:`keep_result`.
        host: the machine this runs on, when the error is read elsewhere.
    """
    on = f" on {host}" if host else ""
    try:
        path = keep_result(data, name)
    except OSError as exc:
        return f"it could not be kept{on} either ({exc})"
    return f'it is kept in {path}{on} (pickle.load(open(path, "rb")) reads it back)'
