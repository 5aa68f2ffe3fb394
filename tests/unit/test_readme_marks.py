"""Every code block of the README says whether the tests run it (tests/spark/test_newcomer.py
runs the ones that do, from the installed wheel)."""

from __future__ import annotations

from pathlib import Path

from tests.readme_blocks import RUNS, blocks, runnable_script

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_block_is_marked() -> None:
    unmarked = [f"line {b.line} ({b.language or 'plain'})" for b in blocks(README) if not b.marker]
    assert not unmarked, (
        "README blocks without a '<!-- readme-test: ... -->' line before them: "
        + ", ".join(unmarked)
    )


def test_blocks_not_run_say_why_and_run_ones_are_python() -> None:
    for block in blocks(README):
        assert block.marker is not None
        if block.marker == RUNS:
            assert block.language == "python", f"line {block.line}: only Python blocks run"
        else:
            assert block.marker.startswith("not run (") and block.marker.endswith(")"), (
                f"line {block.line}: a block that does not run says why: {block.marker!r}"
            )


def test_the_runnable_blocks_compile_as_one_script() -> None:
    script = runnable_script(README)
    assert script.count("--- README block at line") >= 4
    compile(script, "README.md", "exec")
