"""Cross-references in the docs and the README say where they go: a link that names a page
names it by its title, and "see X above" names a heading that is above."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# [text](target.md) or [text](target.md#anchor); images and absolute URLs are not pages.
LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#:]+\.md)(#[^)\s]*)?\)")
# "What a node is" above: a section of the same page, named in quotes.
QUOTED = re.compile(r'"([^"\n]{3,80})"\s+(above|below)')


def _pages() -> dict[str, Path]:
    """Every page of the site by its path under docs/; the README is under its own name."""
    pages = {p.relative_to(DOCS).as_posix(): p for p in DOCS.rglob("*.md")}
    pages["../README.md"] = ROOT / "README.md"
    return pages


def _nav_titles(nav: list, into: dict[str, set[str]]) -> None:
    for item in nav:
        for title, target in item.items() if isinstance(item, dict) else ():
            if isinstance(target, list):
                _nav_titles(target, into)
            else:
                into.setdefault(target, set()).add(title)


def _titles() -> dict[str, set[str]]:
    """The names a page goes by: its heading, its title in the navigation, and the part of
    either before a colon ("Frameworks" for "Frameworks: Lightning, ...")."""
    names: dict[str, set[str]] = {}
    for rel, path in _pages().items():
        heading = re.search(r"(?m)^# (.+)$", path.read_text(encoding="utf-8"))
        if heading:
            names.setdefault(rel, set()).add(heading.group(1).strip())
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    _nav_titles(config["nav"], names)
    return {rel: names_ | {n.split(":")[0] for n in names_} for rel, names_ in names.items()}


def _destination(source: str, target: str) -> str:
    if source == "../README.md":
        return posixpath.normpath(target.removeprefix("docs/"))
    return posixpath.normpath(posixpath.join(posixpath.dirname(source), target))


def test_a_link_that_names_a_page_uses_its_title() -> None:
    """Link text in capitals, as a page's name is written in running text ("see [Runs]"),
    is that page's title; lower-case text is prose ("a [first run on a laptop]")."""
    titles = _titles()
    wrong = []
    for source, path in _pages().items():
        for text, target, anchor in LINK.findall(path.read_text(encoding="utf-8")):
            name = text.strip("`*")
            if anchor or not name[:1].isupper():
                continue
            destination = _destination(source, target)
            if destination in titles and name not in titles[destination]:
                wrong.append(
                    f"{source}: [{text}]({target}) is titled {sorted(titles[destination])}"
                )
    assert wrong == []


def test_a_section_named_above_or_below_is_there() -> None:
    wrong = []
    for source, path in _pages().items():
        text = path.read_text(encoding="utf-8")
        headings = {h.strip() for h in re.findall(r"(?m)^#+ (.+)$", text)}
        for name, where in QUOTED.findall(text):
            if " ".join(name.split()) not in headings:
                wrong.append(f'{source}: "{name}" {where} is no heading of the page')
    assert wrong == []
