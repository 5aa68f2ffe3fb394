"""Naming the piece of a call that cannot be pickled: an argument, a captured variable, a
global the function uses, a default, or the object a method is bound to."""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any


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


def culprit(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    fails: Callable[[Any], Exception | None],
) -> str:
    """Name the first piece that cannot be pickled, descending into nested functions."""
    candidates: list[tuple[str, Any]] = [(f"argument #{i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    candidates += list(_captured(fn))
    for where, value in candidates:
        error = fails(value)
        if error is None:
            continue
        if inspect.isfunction(value) or inspect.ismethod(value):
            inner = culprit(value, (), {}, fails)
            if inner:
                return f"{inner} (reached through {where})"
        return f"{where}, of type {type_name(value)} ({type(error).__name__}: {error})"
    return ""


def type_name(value: Any) -> str:
    """A value's type as a message names it: ``module.Class``, or a builtin's bare name."""
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__name__
