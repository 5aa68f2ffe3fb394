"""The code blocks of the README and of the documentation site, as the newcomer tests read them.

Every fenced block is preceded by a marker line: ``<!-- readme-test: runs as written -->``
for a Python block that the tests run, in order, in one process; or ``<!-- readme-test: not
run (why) -->`` saying what it leaves out. The order is the README's blocks first, then each
page of the site in the order of ``mkdocs.yml``'s navigation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNS = "runs as written"
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_MARKER = re.compile(r"^<!-- readme-test: (.+?) -->$")
_FENCE = re.compile(r"^```(\S*)\s*$")
_NAV_PAGE = re.compile(r"^\s*-\s+(?:[^:]+:\s+)?(\S+\.md)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of the fence), its language, its
    marker (None when the line before the fence is not one) and its text."""

    line: int
    language: str
    marker: str | None
    text: str


def blocks(readme: Path) -> list[Block]:
    """Every fenced block of ``readme``, in order."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        found.append(
            Block(start + 1, fence.group(1), marker.group(1) if marker else None, "\n".join(body))
        )
        i += 1
    return found


def site_pages(root: Path = ROOT) -> list[Path]:
    """The pages of the site, in the order of ``mkdocs.yml``'s ``nav``."""
    pages = []
    in_nav = False
    for line in (root / "mkdocs.yml").read_text(encoding="utf-8").splitlines():
        if not line.startswith((" ", "-")):
            in_nav = line.startswith("nav:")
            continue
        match = _NAV_PAGE.match(line) if in_nav else None
        if match:
            pages.append(root / "docs" / match.group(1))
    return pages


def documents(root: Path = ROOT) -> list[Path]:
    """The README, then the site's pages in navigation order: the order the blocks run in."""
    return [root / "README.md", *site_pages(root)]


def runnable_script(paths: list[Path], root: Path = ROOT) -> str:
    """The blocks marked to run, of ``paths`` in that order, joined into one script that
    says which file (relative to ``root``) and line each block starts at."""
    parts = []
    for path in paths:
        where = path.relative_to(root) if path.is_relative_to(root) else path.name
        for block in blocks(path):
            if block.marker == RUNS:
                parts.append(f'print("--- block at {where} line {block.line}", flush=True)\n')
                parts.append(block.text + "\n")
    return "\n".join(parts)
