"""TARGET of ``sparktrain run``: a script or ``module:function``, made into the rank function.

:func:`resolve_target` runs on the driver: it reads a script's source, or imports a
function and ships its module by value when executors cannot import it themselves.
:func:`run_script` is the rank function for scripts; it runs inside each rank.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any


class UsageError(Exception):
    """A command line that cannot run; the message says what to change (exit code 2)."""


# -- the rank function for scripts (runs inside each rank) --------------------------------


def run_script(path: str, source: str, argv: list[str]) -> None:
    """Run a script's source as ``__main__`` (``runpy.run_path``) with ``argv`` after its name.

    Where ``path`` holds the same source (np < 0, or a shared file system), it runs from
    there, with ``sys.argv = [path, *argv]``. Elsewhere it runs from a private copy with the
    same file name, so executors need not see the driver's files; ``sys.argv[0]`` and
    ``__file__`` then name that copy (``runpy`` sets them to the file it runs).

    Args:
        path: the script's absolute path on the driver.
        source: the script's source, as read on the driver.
        argv: the arguments after the script's name.

    Raises:
        BaseException: whatever the script raises, its traceback starting in the script.
    """
    import linecache
    import runpy
    import shutil
    import tempfile

    target, tmp = path, None
    if not _has_source(path, source):
        tmp = tempfile.mkdtemp(prefix="sparktrain-script-")
        target = os.path.join(tmp, os.path.basename(path) or "script.py")
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(source)
        # The copy is gone by the time the traceback is rendered; keep its lines for it
        # (an entry without an mtime survives linecache.checkcache).
        linecache.cache[target] = (len(source), None, source.splitlines(True), target)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    try:
        runpy.run_path(target, run_name="__main__")
    except BaseException as exc:
        # Drop runpy's frames so the traceback goes from here straight into the script.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != target:
            tb = tb.tb_next
        exc.with_traceback(tb or exc.__traceback__)
        raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _has_source(path: str, source: str) -> bool:
    try:
        return _read_text(path) == source
    except (OSError, UnicodeDecodeError):
        return False


# -- resolving TARGET (on the driver) -----------------------------------------------------


def resolve_target(target: str, args: list[str]) -> tuple[Callable[..., Any], list[Any]]:
    """The function every rank runs and its positional arguments.

    Args:
        target: ``path/to/script.py`` or ``module:function`` (``module:obj.method`` too).
        args: the ARGS given after ``--``.

    Returns:
        :func:`run_script` and its arguments for a script; for ``module:function``, the
        function and either ``[args]`` (ARGS given, or a first parameter without default)
        or ``[]``.

    Raises:
        UsageError: the script does not exist, the module or function cannot be found, or
            the function cannot take the given ARGS.
    """
    if target.endswith(".py") or os.path.isfile(target):
        if not os.path.isfile(target):
            raise UsageError(f"script {target!r} not found")
        try:
            source = _read_text(target)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read script {target!r}: {exc}") from None
        return run_script, [os.path.abspath(target), source, list(args)]
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"TARGET {target!r} is neither a .py script nor module:function")
    fn = _import_function(module_name, attr)
    if not _wants_argv(fn, args):
        return fn, []
    try:
        inspect.signature(fn).bind(list(args))
    except TypeError:
        raise UsageError(
            f"{target} takes no arguments, but ARGS were given after `--`; "
            "give it a parameter for the list of arguments"
        ) from None
    except ValueError:  # no signature (a builtin): let the call decide
        pass
    return fn, [list(args)]


def _import_function(module_name: str, attr: str) -> Callable[..., Any]:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` does
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            raise UsageError(
                f"module {module_name!r} not found (from {cwd}; is it installed or on PYTHONPATH?)"
            ) from None
        raise UsageError(f"importing {module_name!r} failed:\n{traceback.format_exc()}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"{module_name}:{attr} is not callable")
    _ship_by_value(module)
    fn: Callable[..., Any] = obj
    return fn


def _wants_argv(fn: Callable[..., Any], args: list[str]) -> bool:
    """ARGS were given, or the first parameter has no default (e.g. ``main(argv)``)."""
    if args:
        return True
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return (
        bool(parameters)
        and parameters[0].kind in positional
        and parameters[0].default is inspect.Parameter.empty
    )


def _ship_by_value(module: ModuleType) -> None:
    """Pickle a module's functions by value unless executors can import it themselves."""
    path = getattr(module, "__file__", None)
    if not path or module.__name__.split(".")[0] == "sparktrain":
        return
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    real = os.path.realpath(path)
    if any(real.startswith(os.path.realpath(p) + os.sep) for p in installed):
        return
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
