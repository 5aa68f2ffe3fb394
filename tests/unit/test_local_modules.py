"""The user's own modules travel with a run: which ones (found on the driver), the limit on
their size, the setting that turns it off, and how a rank writes and imports them."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from sparktrain.config import RunConfig
from sparktrain.errors import PayloadError
from sparktrain.shipping import module_copies
from sparktrain.shipping.local_modules import Scope, scope_of
from sparktrain.shipping.payload import dump_call, load_call, shipped_modules

BIG = 1 << 30

# A project folder as a notebook user has one: helper modules beside the notebook, a package,
# modules never imported, and a virtual environment inside it. Names carry a prefix of their
# own, as they go into this process's sys.modules.
PROJECT = {
    "lm_helper.py": "import json\nimport lm_base\nfrom lm_pkg import sub\n"
    "VALUE = lm_base.BASE + 1\n\n\ndef value():\n    return VALUE + sub.sibling.ONE\n",
    "lm_base.py": "BASE = 40\n",
    "lm_body.py": "def hello():\n    return 'hi'\n",
    "lm_unused.py": "raise RuntimeError('never imported')\n",
    "lm_pkg/__init__.py": "",
    "lm_pkg/sub.py": "from . import sibling\n",
    "lm_pkg/sibling.py": "ONE = 1\n",
    "lm_pkg/unused_sub.py": "raise RuntimeError('never imported')\n",
    "lm_shapes.py": "class Shape:\n    def __init__(self, n):\n        self.n = n\n",
    ".venv/lib/python3.11/site-packages/lm_installed.py": "TWO = 2\n",
}
SITE = ".venv/lib/python3.11/site-packages"

# A notebook cell: functions of a module that cannot be imported are pickled by value.
CELL = """
import lm_helper


def train():
    import json, sparktrain
    import lm_body
    import lm_installed
    return lm_helper.value(), lm_body.hello(), lm_installed.TWO
"""


def write_tree(folder: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The project folder, as the working folder and first on sys.path (as '' is in a notebook
    or ``python -c``); its modules leave sys.modules afterwards."""
    folder = tmp_path / "project"
    write_tree(folder, PROJECT)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder / SITE))
    monkeypatch.syspath_prepend("")
    yield folder
    for name in [n for n in sys.modules if n.startswith(("lm_", "sm_"))]:
        del sys.modules[name]


def cell() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "local_modules_test_cell"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)
    return namespace


def travelling(fn: Any, *args: Any, limit: int = BIG) -> dict[str, bytes]:
    return shipped_modules(dump_call(fn, args, {}, BIG, Scope.for_function(limit)))


# --- which modules travel -------------------------------------------------------------------


def test_a_notebook_function_sends_the_modules_it_uses_imports_and_their_own_imports(
    project: Path,
) -> None:
    files = travelling(cell()["train"])
    # lm_helper: a global; lm_body: imported in the body; lm_base and the package's modules:
    # imported by lm_helper, relative imports included; never lm_unused, lm_pkg.unused_sub,
    # the module of the virtual environment inside the project, json or sparktrain.
    assert sorted(files) == [
        "lm_base.py",
        "lm_body.py",
        "lm_helper.py",
        "lm_pkg/__init__.py",
        "lm_pkg/sibling.py",
        "lm_pkg/sub.py",
    ]
    for rel, data in files.items():
        assert data == (project / rel).read_bytes()


def test_a_function_of_a_local_module_and_an_argument_of_a_local_class_send_their_modules(
    project: Path,
) -> None:
    import lm_helper
    import lm_shapes

    files = travelling(lm_helper.value, lm_shapes.Shape(3))
    assert {"lm_helper.py", "lm_shapes.py", "lm_base.py", "lm_pkg/sub.py"} <= set(files)
    assert "lm_body.py" not in files


def test_modules_outside_the_working_folder_stay(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_tree(elsewhere, {"sm_far.py": "FAR = 1\n"})
    monkeypatch.syspath_prepend(str(elsewhere))
    import sm_far

    namespace = cell()
    namespace["sm_far"] = sm_far
    exec("def uses_far():\n    return sm_far.FAR, lm_helper.value()\n", namespace)
    files = travelling(namespace["uses_far"])
    assert "lm_helper.py" in files and not any("sm_far" in rel for rel in files)


def test_a_script_sends_the_modules_of_its_own_folder_that_it_imports(project: Path) -> None:
    scripts = project / "scripts"
    write_tree(
        scripts,
        {
            "train.py": "import sys\nimport sm_near\nimport lm_base\nfrom sm_tools import util\n",
            "sm_near.py": "NEAR = 1\n",
            "sm_tools/__init__.py": "",
            "sm_tools/util.py": "import sm_near\n",
            "sm_not_imported.py": "",
        },
    )
    scope = scope_of(True, BIG, [str(scripts / "train.py"), (scripts / "train.py").read_text()])
    assert scope is not None and scope.root == os.path.realpath(scripts)
    # lm_base sits in the working folder, not the script's: `python train.py` would not find it.
    assert sorted(scope.files([])) == ["sm_near.py", "sm_tools/__init__.py", "sm_tools/util.py"]


def test_a_working_folder_that_was_removed_sends_nothing_and_the_call_still_pickles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert Scope.for_function(BIG).root == ""
    fn, args, _ = load_call(dump_call(len, ([1, 2],), {}, BIG, Scope.for_function(BIG)))
    assert fn(*args) == 2


# --- the limit, and the setting that turns it off ---------------------------------------------


def test_modules_over_the_limit_are_refused_naming_the_module_and_the_settings(
    project: Path,
) -> None:
    (project / "lm_body.py").write_text("def hello():\n    return 'hi'\n" + "# padding\n" * 200)
    size = (project / "lm_body.py").stat().st_size
    with pytest.raises(PayloadError) as info:
        travelling(cell()["train"], limit=1000)
    message = str(info.value)
    assert f"'lm_body' ({project / 'lm_body.py'}, {size} bytes)" in message
    assert "over the limit of 1000 bytes (max_module_bytes / spark.sparktrain.maxModuleBytes)" in (
        message
    )
    assert "install these modules on the executors and set ship_modules=False" in message


def test_ship_modules_false_sends_none(project: Path) -> None:
    config = RunConfig.resolve(-1, spark_conf={"spark.sparktrain.shipModules": "false"})
    assert config.ship_modules is False and RunConfig(np=-1).ship_modules is True
    assert scope_of(config.ship_modules, config.max_module_bytes) is None
    data = dump_call(cell()["train"], (), {}, BIG, None)
    assert shipped_modules(data) == {}
    assert scope_of(True, 16 << 20) == Scope(os.path.realpath(project), None, 16 << 20)


# --- on the rank ------------------------------------------------------------------------------


@pytest.fixture
def rank_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank's sys.path and PYTHONPATH, restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/earlier")


def test_the_call_loads_where_the_modules_exist_only_as_the_copies_that_travelled(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank_paths: None
) -> None:
    import lm_helper
    import lm_shapes

    data = dump_call(lm_helper.value, (lm_shapes.Shape(2),), {}, BIG, Scope.for_function(BIG))
    # The rank: a host without the project folder, that never imported its modules.
    os.rename(project, tmp_path / "moved")
    monkeypatch.chdir(tmp_path)
    for name in [n for n in sys.modules if n.startswith("lm_")]:
        del sys.modules[name]
    task = tmp_path / "task"
    task.mkdir(mode=0o700)
    fn, args, _ = load_call(data, task)
    assert fn() == 42 and args[0].n == 2
    [copies] = task.iterdir()
    assert sys.path[0] == str(copies) and os.environ["PYTHONPATH"] == f"{copies}:/earlier"
    assert stat.S_IMODE(copies.stat().st_mode) == 0o700
    assert sys.modules["lm_helper"].__file__ == str(copies / "lm_helper.py")


def test_modules_the_rank_already_imports_from_the_same_files_are_not_copied(
    project: Path, tmp_path: Path, rank_paths: None
) -> None:
    same = {"lm_base.py": (project / "lm_base.py").read_bytes()}
    assert module_copies.install(same, tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["project"]  # no folder of copies
    # A different file of that name (an older copy on the host) gives way to the driver's.
    folder = module_copies.install({"lm_base.py": b"BASE = 1\n"}, tmp_path)
    assert folder is not None and (folder / "lm_base.py").read_bytes() == b"BASE = 1\n"
    assert sys.path[0] == str(folder)


class EditableFinder:
    """What an editable install (``pip install -e``) adds to ``sys.meta_path``: a finder that
    maps its modules to the project's files, which no folder on ``sys.path`` holds."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        return importlib.util.spec_from_file_location(name, self.path)


def test_a_module_an_editable_install_gives_from_the_same_file_is_not_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank_paths: None
) -> None:
    source = tmp_path / "src" / "lm_editable.py"
    write_tree(tmp_path / "src", {"lm_editable.py": "EDITABLE = 1\n"})
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, EditableFinder("lm_editable", source)])
    assert module_copies.install({"lm_editable.py": source.read_bytes()}, tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("rel", ["../evil.py", "/etc/evil.py", "pkg/evil.sh", "a-b/c.py"])
def test_a_path_that_is_not_a_module_is_refused(rel: str, tmp_path: Path) -> None:
    with pytest.raises(PayloadError, match="not a module's path"):
        module_copies.install({rel: b""}, tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- a run whose ranks cannot see the working folder -------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH needs Python 3.11")
def test_a_local_run_imports_a_helper_its_ranks_cannot_see_only_when_modules_travel(
    project: Path,
) -> None:
    # PYTHONSAFEPATH keeps the ranks' working folder (the project) off their sys.path, as an
    # executor's is: the helper modules reach them only by travelling with the run.
    runner = dict(env={"PYTHONSAFEPATH": "1"}, warm_start=False, start_timeout=60)
    train = cell()["train"]
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=-1, ship_modules=False, **runner).run(train)
    assert "No module named 'lm_helper'" in str(info.value)
    assert SparkRunner(np=-1, **runner).run(train) == (42, "hi", 2)


def test_runs_submitted_together_parse_their_modules_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CPython before 3.12.5 (gh-106905) can fail two threads' ast.parse at once with
    # "SystemError: AST constructor recursion depth mismatch": a run submitted beside another
    # failed so. Each parse must hold the module's lock, whatever thread it runs in.
    import ast
    import threading

    from sparktrain.shipping import local_modules

    parse, held = ast.parse, []

    def watched(source: Any, *args: Any, **kwargs: Any) -> Any:
        held.append(local_modules._PARSING.locked())
        return parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", watched)
    source = b"import os\nfrom . import sibling\n"
    found: list[set[str]] = []
    threads = [
        threading.Thread(
            target=lambda: found.append(local_modules.imports_in_source(source, "pkg.mod", False))
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert held == [True] * 4
    assert found == [{"os", "pkg", "pkg.sibling"}] * 4
