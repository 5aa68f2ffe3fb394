"""The README's code blocks, as the newcomer tests read them.

Every fenced block is preceded by a marker line: ``<!-- readme-test: runs as written -->``
for a Python block that the tests run, in order, in one process; or ``<!-- readme-test: not
run (why) -->`` saying what it leaves out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNS = "runs as written"
_MARKER = re.compile(r"^<!-- readme-test: (.+?) -->$")
_FENCE = re.compile(r"^```(\S*)\s*$")


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


def runnable_script(readme: Path) -> str:
    """The blocks marked to run, joined into one script that says which block it is in."""
    parts = []
    for block in blocks(readme):
        if block.marker == RUNS:
            parts.append(f'print("--- README block at line {block.line}", flush=True)\n')
            parts.append(block.text + "\n")
    return "\n".join(parts)
