"""The user's own modules that travel with a run: which ones, found on the driver.

A notebook's function often uses a module of the project it sits in (``mnist_like.py`` beside
the notebook) that is installed nowhere, so the executors of other hosts cannot import it. The
modules a run needs that live in the driver's working folder (for a script, in the script's
folder), outside the Python installation and any ``site-packages``, travel with the run as
source files: each rank writes them into a private folder of its own and puts it on
``sys.path`` (see :mod:`sparktrain.shipping.module_copies`).

Files, not cloudpickle's ``register_pickle_by_value``: by value, only what the pickle reaches
travels, while a module imported inside the function's body, or by a script, is looked up by
name when the rank runs that line, and would still be missing. Files cover both, keep one
module object per module (``isinstance`` and module-level state behave as on the driver),
keep tracebacks on the real lines, and reach the processes a rank starts (DataLoader workers).

Which modules: those the pickle of the call reaches (the modules of the functions and classes
it holds, and modules held as values), those that code pickled by value imports (its
``IMPORT_NAME`` instructions: imports inside the function's body), for a script those its
source imports; then, module by module, those that each one found imports anywhere in its
source, and the packages that hold them (their ``__init__.py`` runs on import). A module
imported by a name computed at run time (``importlib.import_module(name)``) is not seen.
Names are looked up without importing anything: a function's in the driver's loaded modules,
then on its ``sys.path``; a script's in its own folder alone, where ``python train.py`` finds
them. sparktrain itself, PySpark, the standard library and the main module never travel.
"""

from __future__ import annotations

import ast
import dataclasses
import dis
import importlib.machinery
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from sparktrain.errors import PayloadError
from sparktrain.log import get_logger

_log = get_logger(__name__)
# One ast.parse at a time: in CPython before 3.12.5 (gh-106905) two threads parsing at once
# can fail with "SystemError: AST constructor recursion depth mismatch", and runs submitted
# together read their modules' imports in threads of their own.
_PARSING = threading.Lock()

# Top-level names that never travel: the ranks have their own (or they are no file at all).
NEVER = frozenset(
    {"sparktrain", "_sparktrain_horovod", "pyspark", "py4j", "__main__", "__mp_main__"}
) | frozenset(sys.stdlib_module_names)
# Folders of installed packages, wherever they are (a virtual environment inside the project).
_INSTALLED_PARTS = frozenset({"site-packages", "dist-packages"})
# The instructions that load IMPORT_NAME's level (3.14 loads small ints with their own).
_LOAD_LEVEL = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})
SETTINGS = "ship_modules=False / spark.sparktrain.shipModules"
LIMIT = "max_module_bytes / spark.sparktrain.maxModuleBytes"


@dataclasses.dataclass(frozen=True)
class Scope:
    """Where the modules that travel with one run are looked for, and how much may travel.

    Attributes:
        root: the folder whose modules travel (real path): the working folder, or a script's.
        search: the folders names are looked up in; None for the driver's own view (its loaded
            modules, then its ``sys.path``).
        limit: the most bytes their files may take together.
        names: modules known to be needed before the call is pickled (a script's imports).
    """

    root: str
    search: tuple[str, ...] | None
    limit: int
    names: frozenset[str] = frozenset()

    @classmethod
    def for_function(cls, limit: int) -> Scope:
        """A function's: the modules of the driver's working folder."""
        try:
            root = os.path.realpath(os.getcwd())
        except OSError:  # the working folder was removed: nothing is in it
            root = ""
        return cls(root, None, limit)

    @classmethod
    def for_script(cls, path: str, source: str, limit: int) -> Scope:
        """A script's: the modules of its own folder that its source imports."""
        folder = os.path.dirname(os.path.abspath(path))
        names = frozenset(imports_in_source(source.encode("utf-8"), "", package=False))
        return cls(os.path.realpath(folder), (folder,), limit, names)

    def files(self, names: Iterable[str]) -> dict[str, bytes]:
        """The source files that travel, for a call whose pickle reached ``names``.

        Returns:
            ``{path relative to the folder it is imported from: contents}``, e.g.
            ``{"mnist_like.py": b"...", "helpers/__init__.py": b"..."}``.

        Raises:
            PayloadError: they take more than :attr:`limit` bytes (naming the modules).
        """
        return _Collection(self).run([*self.names, *names])


@dataclasses.dataclass(frozen=True)
class _Found:
    name: str  # the module's name
    path: str  # its file on the driver
    rel: str  # that file's path from the folder the module is imported from
    package: bool


class _Collection:
    """One search: the files found so far, their sizes, and the specs already looked up."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.files: dict[str, bytes] = {}
        self.sizes: dict[str, int] = {}
        self.specs: dict[str, ModuleSpec | None] = {}
        self.installed = _installed_folders()

    def run(self, names: Iterable[str]) -> dict[str, bytes]:
        todo, seen = list(names), set()
        while todo:
            name = todo.pop()
            if name in seen or not name or name.partition(".")[0] in NEVER:
                continue
            seen.add(name)
            found = self._find(name)
            if found is None or found.rel in self.files:
                continue
            parts = name.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # its packages
            data = self._read(found)
            self.files[found.rel] = data
            todo.extend(imports_in_source(data, name, found.package))
        if self.files:
            _log.debug(
                "modules that travel with the run: %s (%d bytes)",
                ", ".join(sorted(self.sizes)),
                sum(self.sizes.values()),
            )
        return self.files

    def _spec(self, name: str) -> ModuleSpec | None:
        if name not in self.specs:
            self.specs[name] = _lookup(name, self.scope.search, self._spec)
        return self.specs[name]

    def _find(self, name: str) -> _Found | None:
        spec = self._spec(name)
        if spec is None or not spec.has_location or not (spec.origin or "").endswith(".py"):
            return None
        origin = str(spec.origin)
        package = spec.submodule_search_locations is not None
        parts = name.split(".")
        rel = Path(*parts, "__init__.py") if package else Path(*parts[:-1], f"{parts[-1]}.py")
        path = Path(origin)
        if len(path.parts) <= len(rel.parts) or path.parts[-len(rel.parts) :] != rel.parts:
            return None  # loaded under a name its place does not give: no import finds it
        real = os.path.realpath(origin)
        if not _within(real, self.scope.root) or not os.path.isfile(real):
            return None
        if _INSTALLED_PARTS & set(Path(real).parts) or any(
            _within(real, d) for d in self.installed
        ):
            return None
        return _Found(name, origin, rel.as_posix(), package)

    def _read(self, found: _Found) -> bytes:
        try:
            self.sizes[found.name] = os.stat(found.path).st_size
            total = sum(self.sizes.values())
            if total > self.scope.limit:
                raise PayloadError(self._too_large(found, total))
            return Path(found.path).read_bytes()
        except OSError as exc:
            raise PayloadError(
                f"cannot read the module {found.name!r} ({found.path}) to send it with the run: "
                f"{exc}. Make it readable, or install it on the executors and set {SETTINGS}"
            ) from exc

    def _too_large(self, found: _Found, total: int) -> str:
        largest = sorted(self.sizes.items(), key=lambda item: -item[1])[:3]
        listed = ", ".join(f"{name!r} {_size(size)}" for name, size in largest)
        return (
            f"the modules that travel with the run from {self.scope.root} take {_size(total)} "
            f"with {found.name!r} ({found.path}, {_size(self.sizes[found.name])}), over the "
            f"limit of {_size(self.scope.limit)} ({LIMIT}); the largest: {listed}. Raise the "
            f"limit, or install these modules on the executors and set {SETTINGS}"
        )


def _lookup(
    name: str, search: tuple[str, ...] | None, spec_of: Callable[[str], ModuleSpec | None]
) -> ModuleSpec | None:
    """``name``'s spec without importing it: the driver's loaded module (``search`` None),
    else what the import system would find in ``search`` (None: ``sys.path``)."""
    if search is None:
        module = sys.modules.get(name)
        if module is not None:
            spec = getattr(module, "__spec__", None)
            return spec if isinstance(spec, ModuleSpec) else None
    parent = name.rpartition(".")[0]
    path: list[str] | None = list(search) if search is not None else None
    if parent:
        parent_spec = spec_of(parent)
        locations = parent_spec.submodule_search_locations if parent_spec is not None else None
        if not locations:
            return None
        path = list(locations)
    try:
        return importlib.machinery.PathFinder.find_spec(name, path)
    except (ImportError, ValueError, OSError):
        return None


def imports_in_source(source: bytes, name: str, package: bool) -> set[str]:
    """The modules the source of module ``name`` imports, anywhere in it, absolute.

    ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a module); relative imports are
    resolved against ``name``'s package.
    """
    try:
        with _PARSING:
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()  # the rank will raise the same error, on the line that has it
    found: set[str] = set()
    home = name if package else name.rpartition(".")[0]
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node.module, node.level, home)
            if target:
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names if a.name != "*")
    return found


def _statements(nodes: list[Any]) -> Iterator[ast.AST]:
    """Every statement in ``nodes`` and in the blocks they hold (an import is a statement:
    expressions, by far the most nodes, need no visit)."""
    for node in nodes:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, block, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def imports_in_code(code: types.CodeType) -> Iterator[str]:
    """The modules one code object imports by absolute name (its ``IMPORT_NAME``, and
    ``IMPORT_FROM``'s names under them); nested code objects are left to the caller."""
    instructions = list(dis.get_instructions(code))
    current = ""
    for i, instruction in enumerate(instructions):
        if instruction.opname == "IMPORT_NAME":
            before = instructions[i - 2] if i >= 2 else None
            level = before.argval if before is not None and before.opname in _LOAD_LEVEL else 0
            current = str(instruction.argval) if level == 0 else ""
            if current:
                yield current
        elif instruction.opname == "IMPORT_FROM" and current:
            yield f"{current}.{instruction.argval}"


def _absolute(module: str | None, level: int, home: str) -> str:
    """The absolute name of ``from <level dots><module> import``, in package ``home``."""
    if level == 0:
        return module or ""
    parts = home.split(".") if home else []
    if level - 1 >= len(parts):
        return ""  # above the top-level package: the import fails on the driver too
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _installed_folders() -> list[str]:
    """The folders of the Python installation: its standard library and its packages."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[k]) for k in keys if paths.get(k)})


def _within(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:
        return False


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 100 << 10 else f"{n} bytes"


def scope_of(enabled: bool, limit: int, script: Sequence[Any] | None = None) -> Scope | None:
    """Where a run's modules are looked for (None: none travel).

    Args:
        enabled: the ``ship_modules`` setting.
        limit: the ``max_module_bytes`` setting.
        script: for a script, :func:`~sparktrain.shipping.script.script_call`'s
            ``[path, source, args]``; None for a function.
    """
    if not enabled:
        return None
    if script is not None:
        return Scope.for_script(str(script[0]), str(script[1]), limit)
    return Scope.for_function(limit)
