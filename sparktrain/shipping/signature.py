"""Whether ``fn(*args, **kwargs)`` fits ``fn``'s signature, checked on the driver.

A misspelt keyword (``lrr=0.1``) would otherwise surface on every rank after the Spark job
started, as a TypeError in each rank's traceback; here it costs nothing and names the fix.
"""

from __future__ import annotations

import difflib
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
        what = _unexpected(signature, len(args), kwargs) or str(exc)
        raise CallError(
            f"{name}{signature} cannot be called with the arguments given to run(): {what}. "
            "Nothing was started; fix the arguments (or the function's parameters)"
        ) from None


def _unexpected(
    signature: inspect.Signature, positional: int, kwargs: Mapping[str, Any]
) -> str | None:
    """What is wrong with keywords the function does not take, with the nearest parameter.

    Python's own message for ``train(lrr=0.1)`` where ``train(lr)`` is "missing a required
    argument: 'lr'", which hides the misspelling; this names it. None when every keyword is
    taken (or the function takes ``**kwargs``).
    """
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    keywords = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = [k for k in kwargs if k not in keywords]
    if not unknown:
        return None
    ordered = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    given = set(kwargs) | set(ordered[:positional])  # what the call already gives
    free = [k for k in keywords if k not in given]
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, free, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parts.append(f"unexpected keyword {key!r}{hint}")
    return "; ".join(parts)
