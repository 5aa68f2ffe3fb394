"""Cross-references in the docs and the README say where they go: a link that names a page
names it by its title, and "see X above" names a heading that is above."""

from __future__ import annotations

import posixpath
import re
import unicodedata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# [text](target.md) or [text](target.md#anchor); images and absolute URLs are not pages.
LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#:]+\.md)(#[^)\s]*)?\)")
# "What a node is" above: a section of the same page, named in quotes (a name may wrap).
QUOTED = re.compile(r'"([^"\n]{3,80}(?:\n[^"\n]{1,80})?)"\s+(above|below)')
# see Exact resume above: the same, unquoted, as a capitalized name after "see".
SEE = re.compile(r"\bsee ([A-Z][^.;:()\[\],]{2,60}?),?\s(above|below)\b")
# [the cluster's needs](#what-the-cluster-needs) below: a section of the same page, linked.
ANCHORED = re.compile(r"(?<!!)\[[^\]]{1,200}\]\(#([^)\s]+)\),?\s+(above|below)\b")


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


def _slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc: a link's text, ASCII, no
    punctuation, lower case, runs of spaces and hyphens as one hyphen)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _headings(text: str) -> list[tuple[int, str, str]]:
    """Each heading of a page (outside code blocks, whose ``#`` lines are comments): the
    offset where its line starts, its text and its anchor (``_1``, ``_2``... after the first
    of a name, as mkdocs numbers them)."""
    found: list[tuple[int, str, str]] = []
    fenced, offset, anchors = False, 0, set()
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#+ (.+)$", line.rstrip("\n"))):
            name = " ".join(heading.group(1).split())
            anchor, n = _slug(name), 0
            while anchor in anchors:
                n += 1
                anchor = f"{_slug(name)}_{n}"
            anchors.add(anchor)
            found.append((offset, name, anchor))
        offset += len(line)
    return found


def misplaced(text: str) -> list[str]:
    """The references to a section of the same page "above" or "below" that name no heading
    of it in that direction: ``"Name" above``, ``see Name above`` and ``[text](#anchor)
    above`` (each also with ``below``)."""
    headings = _headings(text)
    wrong = []
    for form, is_anchor in ((QUOTED, False), (SEE, False), (ANCHORED, True)):
        for found in form.finditer(text):
            name, where = " ".join(found.group(1).split()), found.group(2)
            said = f"#{name}" if is_anchor else f'"{name}"'
            at = [h[0] for h in headings if (h[2] if is_anchor else h[1]) == name]
            if not at:
                wrong.append(f"{said} {where} is no heading of the page")
            elif where == "above" and min(at) > found.start():
                wrong.append(f"{said} {where} is a heading below it")
            elif where == "below" and max(at) < found.start():
                wrong.append(f"{said} {where} is a heading above it")
    return wrong


def test_a_section_named_above_or_below_is_there() -> None:
    """A section of the same page named as "above" (or "below") is a heading that comes
    before (or after) the reference."""
    wrong = [
        f"{source}: {problem}"
        for source, path in _pages().items()
        for problem in misplaced(path.read_text(encoding="utf-8"))
    ]
    assert wrong == []


def test_the_direction_of_a_section_reference_is_checked() -> None:
    page = (
        "# Page\n\n## Setup\n\n"
        'See "Setup" above and "Setup" below, see Setup below, [how](#setup) above.\n'
        'Then [the end](#the-end), below; [later](#setup_1) above; "No such" above.\n\n'
        "```python\n# The end\n```\n\n## Setup\n\n"
        "[first](#setup) above, [second](#setup_1) above.\n"
    )
    assert misplaced(page) == [
        '"No such" above is no heading of the page',
        "#the-end below is no heading of the page",  # the code block's comment is none
        "#setup_1 above is a heading below it",
    ]
