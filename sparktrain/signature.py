"""Whether ``fn(*args, **kwargs)`` fits ``fn``'s signature, checked on the driver.

A misspelt keyword (``lrr=0.1``) would otherwise surface on every rank after the Spark job
started, as a TypeError in each rank's traceback; here it costs nothing and names the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from sparktrain.errors import CallError


def check_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`CallError` when ``fn`` cannot be called with these arguments.

    Functions whose signature Python cannot read (some builtins and C extensions) are not
    judged: the ranks then find out, as before.

    Raises:
        CallError: naming the function, what does not fit and the parameters it takes.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
        raise CallError(
            f"{name}{signature} cannot be called with the arguments given to run(): {exc}. "
            "Nothing was started; fix the arguments (or the function's parameters)"
        ) from None
