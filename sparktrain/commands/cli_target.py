"""TARGET of ``sparktrain run``: a script or ``module:function``, made into the rank function.

:func:`resolve_target` runs on the driver: it reads a script's source (see
:mod:`sparktrain.shipping.script`), or imports a function and ships its module by value when
executors cannot import it themselves.
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

from sparktrain.errors import PayloadError
from sparktrain.shipping.script import run_script, script_call


class UsageError(Exception):
    """A command line that cannot run; the message says what to change (exit code 2)."""


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
            return run_script, script_call(target, tuple(args))
        except PayloadError as exc:
            raise UsageError(str(exc)) from None
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
