"""The Lightning layout check a rank installs: what it says, and that it reaches Lightning's
launcher only once the function imports it (tests/spark/test_frameworks.py runs it with the
real Lightning)."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest

from sparktrain.errors import ConfigurationError
from sparktrain.worker import frameworks

LAUNCHER_SOURCE = """
class _SubprocessScriptLauncher:
    def __init__(self, num_processes, num_nodes):
        self.num_processes = num_processes
        self.num_nodes = num_nodes

    def launch(self, function, *args, **kwargs):
        return function(*args, **kwargs)
"""


@pytest.fixture
def two_ranks_one_host(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("GROUP_WORLD_SIZE", raising=False)


def fake_launcher_module(name: str = "fake_launcher") -> ModuleType:
    module = ModuleType(name)
    exec(LAUNCHER_SOURCE, module.__dict__)  # noqa: S102 - the test's own source
    return module


@pytest.mark.usefixtures("two_ranks_one_host")
def test_layout_problem_names_the_layout_and_both_fixes() -> None:
    assert frameworks.layout_problem(2, 1) is None
    problem = frameworks.layout_problem(1, 2)
    assert problem is not None
    assert "Trainer(devices=1, num_nodes=2) asks for 2 process(es), 1 per node" in problem
    assert "sparktrain started 2 rank(s): 1 node(s) of 2 rank(s) each" in problem
    assert "this is rank 1, LOCAL_RANK 1" in problem
    assert "Write Trainer(devices=2, num_nodes=1) for this layout" in problem
    assert "SparkRunner(..., node='task') and Trainer(devices=1, num_nodes=2)" in problem


def test_layout_problem_with_tasks_as_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """node='task': every rank a node; the TorchDistributor form fits, the host form not."""
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2", "RANK": "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert frameworks.layout_problem(1, 2) is None
    problem = frameworks.layout_problem(2, 1)
    assert problem is not None and "2 node(s) of 1 rank(s) each" in problem


@pytest.mark.usefixtures("two_ranks_one_host")
def test_patched_launch_refuses_a_mismatch_and_runs_a_match() -> None:
    module = fake_launcher_module()
    frameworks.patch_launcher(module)
    frameworks.patch_launcher(module)  # twice: still one check
    launcher = module._SubprocessScriptLauncher
    assert launcher(2, 1).launch(lambda x: x + 1, 1) == 2
    with pytest.raises(ConfigurationError, match=r"Trainer\(devices=1, num_nodes=1\)"):
        launcher(1, 1).launch(lambda: None)
    frameworks.patch_launcher(ModuleType("renamed"))  # a Lightning without the class: no-op


@pytest.mark.usefixtures("two_ranks_one_host")
def test_finder_patches_the_module_when_it_is_imported(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fake_lightning_launcher.py").write_text(LAUNCHER_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(frameworks, "LAUNCHER_MODULES", frozenset({"fake_lightning_launcher"}))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "fake_lightning_launcher", raising=False)
    frameworks.install()
    frameworks.install()
    assert sum(isinstance(f, frameworks.LightningFinder) for f in sys.meta_path) == 1
    module = importlib.import_module("fake_lightning_launcher")
    assert module.__file__ == str(tmp_path / "fake_lightning_launcher.py")
    with pytest.raises(ConfigurationError, match="sparktrain started 2 rank"):
        module._SubprocessScriptLauncher(1, 2).launch(lambda: None)
    importlib.import_module("json")  # other modules import as before
