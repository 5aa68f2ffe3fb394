"""Every code block of the README and of the site's pages says whether the tests run it
(tests/spark/test_newcomer.py runs the ones that do, from the installed wheel, in the order
of ``documents()``)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.readme_blocks import README, RUNS, Block, blocks, documents, runnable_script


def _all_blocks() -> list[tuple[Path, Block]]:
    return [(path, block) for path in documents() for block in blocks(path)]


def test_every_block_is_marked() -> None:
    unmarked = [
        f"{path.name} line {b.line} ({b.language or 'plain'})"
        for path, b in _all_blocks()
        if not b.marker
    ]
    assert not unmarked, (
        "blocks without a '<!-- readme-test: ... -->' line before them: " + ", ".join(unmarked)
    )


def test_blocks_not_run_say_why_and_run_ones_are_python() -> None:
    for path, block in _all_blocks():
        where = f"{path.name} line {block.line}"
        assert block.marker is not None
        if block.marker == RUNS:
            assert block.language == "python", f"{where}: only Python blocks run"
        else:
            assert block.marker.startswith("not run (") and block.marker.endswith(")"), (
                f"{where}: a block that does not run says why: {block.marker!r}"
            )


def test_the_runnable_blocks_compile_as_one_script_readme_first() -> None:
    script = runnable_script(documents())
    assert script.count("--- block at ") >= 8
    assert script.index("--- block at README.md line") < script.index("--- block at docs/")
    compile(script, "README.md+docs", "exec")


def test_every_page_of_docs_is_in_the_navigation() -> None:
    docs = README.parent / "docs"
    listed = set(documents()[1:])
    on_disk = set(docs.rglob("*.md"))
    assert on_disk - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - on_disk == set(), "nav entries without a page"


def test_the_laptop_page_shows_the_readme_first_run_word_for_word() -> None:
    first = next(b for b in blocks(README) if b.marker == RUNS)
    laptop = README.parent / "docs" / "getting-started" / "laptop.md"
    assert first.text in [b.text for b in blocks(laptop)]


def test_the_readme_links_to_pages_that_exist() -> None:
    """The README's links into the site are relative, so they work on GitHub and PyPI's
    mirror of the repository alike; each must name a page that is there."""
    text = README.read_text(encoding="utf-8")
    targets = {t.split("#")[0] for t in re.findall(r"\]\((docs/[^)\s]+)\)", text)}
    assert len(targets) >= 15
    missing = sorted(t for t in targets if not (README.parent / t).is_file())
    assert missing == []
