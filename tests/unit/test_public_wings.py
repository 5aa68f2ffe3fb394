"""The stated public API: the package's ``__all__`` and the public wings
(``sparktrain._PUBLIC_WINGS``), each with its ``__all__`` and its page of the API reference, and
nothing the docs teach outside them."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

import sparktrain

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Modules a person runs rather than imports (``python -m ...``, the command's Python form):
# the docs may name them, whatever wing they are in.
COMMANDS = ("sparktrain.examples.", "sparktrain.commands.doctor")
# ``from sparktrain.X import a, b`` / ``import sparktrain.X`` / ``sparktrain.X.name``.
FROM_IMPORT = re.compile(r"from (sparktrain(?:\.\w+)*) import (?:\(([\w,\s]+)\)|([\w, ]+))")
IMPORT = re.compile(r"^\s*import (sparktrain(?:\.\w+)+)", re.M)
ATTRIBUTE = re.compile(r"(?<![\w.])sparktrain\.([a-z_]+)\.(\w+)")


def _taught() -> dict[str, str]:
    """Every Python text users read: the docs' pages, the README and the notebooks' cells."""
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in sorted(DOCS.rglob("*.md"))}
    texts["README.md"] = (ROOT / "README.md").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        texts[notebook.name] = "\n".join("".join(c["source"]) for c in cells)
    return texts


@pytest.mark.parametrize("wing", sparktrain._PUBLIC_WINGS)
def test_each_public_wing_states_its_names_and_documents_them(wing: str) -> None:
    module = importlib.import_module(f"sparktrain.{wing}")
    assert module.__doc__, f"sparktrain.{wing} has no docstring"
    names = module.__all__
    assert names and len(set(names)) == len(names)
    undocumented = [
        name
        for name in names
        if (inspect.isclass(obj := getattr(module, name)) or callable(obj))
        and not inspect.getdoc(obj)
    ]
    assert undocumented == []


def test_each_public_wing_has_its_reference_page_and_no_other_wing_does() -> None:
    pages = {p.stem: p.read_text() for p in (DOCS / "api").glob("*.md")}
    assert sorted(pages) == sorted(sparktrain._PUBLIC_WINGS)
    nav = (ROOT / "mkdocs.yml").read_text()
    for wing, text in pages.items():
        assert f"<!-- public-api sparktrain.{wing} -->" in text
        assert f"sparktrain.{wing}: api/{wing}.md" in nav
        assert f"(api/{wing}.md)" in (DOCS / "api.md").read_text()


def test_the_docs_import_only_public_names() -> None:
    """What the pages, the README and the notebooks import (or call as ``sparktrain.X.name``)
    is a name of ``sparktrain.__all__``, a public wing or a name of its ``__all__``."""
    wings = {f"sparktrain.{wing}" for wing in sparktrain._PUBLIC_WINGS}
    private: list[str] = []

    def check(where: str, module: str, name: str | None) -> None:
        if module.startswith(COMMANDS) or (module == "sparktrain" and name is None):
            return
        if module == "sparktrain":
            public = name in sparktrain.__all__ or f"sparktrain.{name}" in wings
        elif module in wings:
            public = name is None or name in importlib.import_module(module).__all__
        else:
            public = False
        if not public:
            private.append(f"{where}: {module}{'' if name is None else f' {name}'}")

    for where, text in _taught().items():
        for module, grouped, names in FROM_IMPORT.findall(text):
            for name in re.split(r"[,\s]+", (grouped or names).strip()):
                if name and name != "as":
                    check(where, module, name)
        for module in IMPORT.findall(text):
            check(where, module, None)
        for wing, name in ATTRIBUTE.findall(text):
            if f"sparktrain.{wing}" in wings and not f"sparktrain.{wing}.{name}".startswith(
                COMMANDS
            ):
                check(where, f"sparktrain.{wing}", name)
    assert private == [], "\n".join(private)


def test_a_private_import_in_the_docs_would_be_caught() -> None:
    """The pattern above finds what a page could teach: a name outside every ``__all__``."""
    text = "from sparktrain.driver.attempts import Attempts\nsparktrain.checkpoint._store\n"
    assert FROM_IMPORT.findall(text) == [("sparktrain.driver.attempts", "", "Attempts")]
    assert ATTRIBUTE.findall(text)[-1] == ("checkpoint", "_store")
    assert "_store" not in importlib.import_module("sparktrain.checkpoint").__all__
