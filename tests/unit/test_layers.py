"""The import graph of sparktrain/: each module imports only from its own layer or below, and
no group of modules imports itself round in a loop."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sparktrain"

# Subpackages with a layer of their own: Horovod's elastic API (and the shim's names for it)
# keeps its commits through checkpoint, so it sits above the rest of hvdcompat.
SUBPACKAGES = (
    "hvdcompat.elastic",
    "hvdcompat.shim.horovod.torch.elastic",
    "hvdcompat.shim.horovod.common",
)

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS: list[tuple[str, ...]] = [
    (
        "contract",
        "errors",
        "log",
        "stacks",
        "units",
        "private_dir",
        "locked_dirs",
        "rank_outcome",
    ),  # leaves: names, errors, ...
    ("wire",),  # frames, the frame server, the protocol
    ("config", "layout", "shipping"),  # the run's data: settings, layout, pickles
    ("backends",),  # how ranks find each other
    ("worker", "hvdcompat"),  # inside a rank
    ("checkpoint", "data", "plot", *SUBPACKAGES),  # libraries for the user's function
    ("task",),  # inside a Spark task or the local supervisor
    ("driver",),  # on the driver
    ("runner",),  # the public runner
    ("decorator",),  # @distributed, over the runner
    ("inference", "ml"),  # Spark ML stages and batched inference, on top of the runner
    (
        "__init__",
        "__main__",
        "commands",
        "examples",
    ),
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top(module: str) -> str:
    """The first name under ``sparktrain`` (``sparktrain`` itself is ``__init__``), or the
    subpackage of SUBPACKAGES that holds ``module``."""
    parts = module.split(".")
    inner = ".".join(parts[1:])
    for name in SUBPACKAGES:
        if inner == name or inner.startswith(f"{name}."):
            return name
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """The sparktrain modules ``path`` imports (anywhere; inside ``if TYPE_CHECKING`` only
    with ``type_checking``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only and not type_checking:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sparktrain"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("sparktrain"):
                continue
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in modules else node.module)
    return found


def graph(type_checking: bool = False) -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imports(path, modules, type_checking) & modules for name, path in paths.items()}


def test_every_top_level_module_has_a_layer() -> None:
    assert {top(m) for m in graph()} <= set(LAYER_OF), "add the new module to LAYERS"


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = sorted(
        f"{m} (layer {top(m)}) imports {d} (layer {top(d)})"
        for m, deps in graph().items()
        for d in deps
        if LAYER_OF[top(d)] > LAYER_OF[top(m)]
    )
    assert upward == []


def test_the_import_graph_has_no_loop() -> None:
    # Imports for type hints count too: two modules that name each other's types are one
    # module in two files, or need a protocol between them.
    edges = graph(type_checking=True)
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges[node]):
            # A package's own __init__ re-exporting its modules is not a loop of ours.
            if dep == node or node.startswith(dep + "."):
                continue
            if state.get(dep) == 1:
                loops.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert loops == []


def wing(module: str) -> str:
    """The first name under ``sparktrain``, subpackages included (``hvdcompat`` for
    ``sparktrain.hvdcompat.elastic.run``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_two_wings_import_each_other() -> None:
    # Modules of one wing may sit on different layers (hvdcompat's elastic API above the
    # worker, the rest of hvdcompat beside it); the wings themselves still depend one way.
    ties: dict[tuple[str, str], str] = {}
    for m, deps in graph(type_checking=True).items():
        for d in deps:
            if wing(m) != wing(d):
                ties.setdefault((wing(m), wing(d)), f"{m} imports {d}")
    both_ways = sorted(
        f"{ties[(a, b)]}, and {ties[(b, a)]}" for a, b in ties if a < b and (b, a) in ties
    )
    assert both_ways == []
