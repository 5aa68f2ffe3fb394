"""A script file as the rank function: ``run("train.py", "--lr", "0.01")`` and the CLI's TARGET.

:func:`script_call` runs on the driver: it checks the path and arguments and reads the source,
so the script travels with the run and executors need not see the driver's files.
:func:`run_script` is the function every rank then runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from sparktrain import contract, private_dir
from sparktrain.errors import PayloadError


def script_call(path: str | os.PathLike[str], args: tuple[Any, ...]) -> list[Any]:
    """The arguments of :func:`run_script` for the script at ``path`` run with ``args``.

    Args:
        path: a Python script on the driver (relative to its working directory, or absolute).
        args: the command-line arguments after the script's name: strings, as in a shell.

    Returns:
        ``[absolute path, source, list of args]``.

    Raises:
        PayloadError: the path is not a readable file, or an argument is not a str.
    """
    text = os.fspath(path)
    if not os.path.isfile(text):
        kind = "a folder" if os.path.isdir(text) else "not found"
        raise PayloadError(
            f"run() was given the script {text!r}, which is {kind} (relative to "
            f"{os.getcwd()}); pass the path of a .py file, or a function"
        )
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise PayloadError(
                f"argument #{i} of the script {os.path.basename(text)} is a "
                f"{type(arg).__name__} ({arg!r}); a script's arguments are its command line: "
                f"pass strings (str({arg!r}))"
            )
    try:
        source = _read_text(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise PayloadError(f"cannot read the script {text!r}: {exc}") from None
    return [os.path.abspath(text), source, list(args)]


def run_script(path: str, source: str, argv: list[str]) -> None:
    """Run a script's source as ``__main__`` (``runpy.run_path``) with ``argv`` after its name.

    Where ``path`` holds the same source (np < 0, or a shared file system), it runs from
    there, with ``sys.argv = [path, *argv]``. Elsewhere it runs from a private copy with the
    same file name (in the task's own folder, which is removed with the run), so executors
    need not see the driver's files; ``__file__`` then names that copy.

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
        payload = os.environ.get(contract.PAYLOAD_ENV)
        if payload:
            folder = os.path.join(os.path.dirname(payload), f"script-{os.getpid()}")
            os.makedirs(folder, exist_ok=True)
            tmp = folder
        else:
            tmp = tempfile.mkdtemp(prefix="script-", dir=private_dir.usable_root())
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
