"""A rank's Python stack: read from the dump its worker writes on a signal, then summarised.

Every worker (``sparktrain.worker.bootstrap``) registers :mod:`faulthandler` on
:data:`sparktrain.contract.STACK_SIGNAL`; it dumps every thread's stack into a pipe that its
supervisor reads, after one header line (:func:`sparktrain.contract.stack_header`) naming the
main thread and its outermost function. faulthandler writes from its C signal handler, so a
rank blocked in a collective, in ``time.sleep`` or in any other C call answers as well as one
running Python code.

This module reads such a dump (:func:`main_stack`, :func:`is_complete`), finds the innermost
frame of the user's own code and renders the stack for people (:func:`where`, :func:`render`).
It keeps no state.

Example:
    >>> dump = (
    ...     "Current thread 0x00007f00 (most recent call first):\\n"
    ...     '  File "/job/train.py", line 42 in train\\n'
    ...     '  File "<frozen runpy>", line 198 in _run_module_as_main\\n'
    ... )
    >>> stack = main_stack(dump, 0x7F00)
    >>> where(stack, source=lambda path, line: "time.sleep(60)")
    'in train at train.py:42: time.sleep(60)'
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sysconfig
from collections.abc import Callable

# (path, line) -> that line of source, or "" when unknown.
Source = Callable[[str, int], str]

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(?P<path>.*)", line (?P<line>\d+|\?+) in (?P<name>.*)$')
# What faulthandler writes instead of the outer frames past its depth limit (100).
_TRUNCATED = "  ..."
_NO_FRAME = "  <no Python frame>"
_OWN = os.path.dirname(os.path.abspath(__file__))
_IMPORTLIB = "<frozen importlib._bootstrap"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame of a dump.

    Attributes:
        path: the code's file name as the interpreter knows it (``<frozen runpy>`` too).
        line: the line being run (0 when the dump could not tell).
        name: the function's name.
    """

    path: str
    line: int
    name: str

    @property
    def short(self) -> str:
        """``file.py:42``: the file's base name and the line."""
        return f"{os.path.basename(self.path)}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Stack:
    """One thread's stack.

    Attributes:
        frames: most recent call first, as faulthandler writes them.
        truncated: True when faulthandler left out the outermost frames (too deep).
    """

    frames: tuple[Frame, ...]
    truncated: bool = False


def _sections(dump: str) -> list[tuple[int, list[str], bool]]:
    """Each thread's section of ``dump``: (thread id, its lines, whether another followed).

    Only whole lines count: a dump still being written may end in the middle of one.
    """
    sections: list[tuple[int, list[str], bool]] = []
    for line in dump.split("\n")[:-1]:
        match = _THREAD.match(line.rstrip())
        if match:
            if sections:
                ident, lines, _ = sections[-1]
                sections[-1] = (ident, lines, True)
            sections.append((int(match.group(1), 16), [], False))
        elif sections and line.strip():
            sections[-1][1].append(line.rstrip())
    return sections


def _main_section(dump: str, main: int) -> tuple[list[str], bool] | None:
    found = [(lines, closed) for ident, lines, closed in _sections(dump) if ident == main]
    return found[-1] if found else None


def main_stack(dump: str, main: int) -> Stack | None:
    """The stack of thread ``main`` in a faulthandler dump of all threads, or None if absent.

    Args:
        dump: what faulthandler wrote (several dumps: the last one counts).
        main: the thread's ident (``threading.main_thread().ident`` in the worker).
    """
    section = _main_section(dump, main)
    if section is None:
        return None
    frames = []
    for line in section[0]:
        match = _FRAME.match(line)
        if match:
            number = match.group("line")
            frames.append(
                Frame(match.group("path"), int(number) if number.isdigit() else 0, match["name"])
            )
    return Stack(tuple(frames), truncated=_TRUNCATED in section[0])


def is_complete(dump: str, main: int, root: str) -> bool:
    """Whether thread ``main``'s section of ``dump`` has been written to its end.

    It has once another thread's section follows it, or once its last line is its outermost
    frame (function ``root``), faulthandler's mark of a cut stack, or its note that the thread
    runs no Python code.
    """
    section = _main_section(dump, main)
    if section is None:
        return False
    lines, closed = section
    if closed:
        return True
    if not lines:
        return False
    last = lines[-1]
    match = _FRAME.match(last)
    return last in (_TRUNCATED, _NO_FRAME) or (match is not None and match["name"] == root)


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    return tuple(os.path.join(root, "") for root in sorted(roots))


def is_library(path: str) -> bool:
    """Whether ``path`` is code the user did not write: Python's own, an installed package,
    or sparktrain (its examples excepted)."""
    if path.startswith("<frozen "):
        return True
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    if path.startswith(os.path.join(_OWN, "")):
        return not path.startswith(os.path.join(_OWN, "examples", ""))
    return path.startswith(_library_roots())


def _user_index(frames: tuple[Frame, ...]) -> int | None:
    """The index of the innermost frame of the user's code, if any."""
    return next((i for i, f in enumerate(frames) if not is_library(f.path)), None)


def _source(path: str, line: int) -> str:
    return linecache.getline(path, line).strip() if line else ""


def where(stack: Stack, source: Source = _source) -> str:
    """One line for where a stack stands: the innermost call, and the user's line that made
    it, with its source.

    Example: ``in all_reduce (distributed_c10d.py:2501), called from train at train.py:42:
    dist.all_reduce(t)``, or ``in train at train.py:17: time.sleep(60)`` when the innermost
    Python frame is the user's own (the call itself is in C).
    """
    if not stack.frames:
        return "in no Python code"
    inner = next((f for f in stack.frames if not f.path.startswith(_IMPORTLIB)), stack.frames[0])
    index = _user_index(stack.frames)
    user = stack.frames[index] if index is not None else inner
    text = source(user.path, user.line).strip()
    at = f"{user.name} at {user.short}" + (f": {text}" if text else "")
    if user is inner:
        return f"in {at}"
    return f"in {inner.name} ({inner.short}), called from {at}"


def render(stack: Stack, source: Source = _source) -> str:
    """The stack as a traceback reads: most recent call last, with source lines.

    The outer frames that only started the user's function (``runpy``, sparktrain's worker)
    are left out, and so is the import machinery's own (as in Python's tracebacks).
    """
    frames = list(stack.frames)
    users = [i for i, frame in enumerate(frames) if not is_library(frame.path)]
    if users and not stack.truncated:
        frames = frames[: max(users) + 1]
    lines = ["  ... (outer frames not shown)"] if stack.truncated else []
    for frame in reversed(frames):
        if frame.path.startswith(_IMPORTLIB):
            continue
        lines.append(f'  File "{frame.path}", line {frame.line}, in {frame.name}')
        text = source(frame.path, frame.line).strip()
        if text:
            lines.append(f"    {text}")
    return "\n".join(lines)
