"""Time per tier, printed at the end of every run: where the suite's minutes go.

A tier is the folder under ``tests/`` (unit, spark, connect, cluster, gpu); its time is the sum
of its tests' setup, call and teardown, so a shared session's start counts in the tier of the
first test that needed it. The slowest tests of each tier follow, for what to make cheaper.
With ``SPARKTRAIN_TEST_TIMES=FILE`` every test's time is also added to FILE (a ``#`` line for
the run, then seconds, a tab and the test's id, slowest first), for a whole-suite account.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest

_spent: collections.Counter[str] = collections.Counter()
_tests: collections.Counter[str] = collections.Counter()
_counted: dict[str, set[str]] = collections.defaultdict(set)
_started = [0.0]


def tier_of(nodeid: str) -> str:
    """``tests/spark/test_x.py::t`` → ``spark``; a test outside a tier folder → ``other``."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def pytest_sessionstart(session: pytest.Session) -> None:
    _started[0] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.nodeid)
    _spent[tier] += report.duration
    _tests[report.nodeid] += report.duration
    _counted[tier].add(report.nodeid)


def format_table(spent: dict[str, float], counts: dict[str, int], wall: float) -> list[str]:
    """The table's lines: tier, tests, minutes, share of the whole."""
    total = sum(spent.values()) or 1.0
    lines = [f"{'tier':<10}{'tests':>7}{'time':>10}{'share':>8}"]
    for tier, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        lines.append(f"{tier:<10}{counts[tier]:>7}{_minutes(seconds):>10}{seconds / total:>8.0%}")
    lines.append(f"{'all':<10}{sum(counts.values()):>7}{_minutes(wall):>10}  (wall clock)")
    return lines


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 (pytest's own type)
    if not _spent:
        return
    wall = time.monotonic() - _started[0]
    write = terminalreporter.write_line
    terminalreporter.section("time per tier")
    counts = {tier: len(ids) for tier, ids in _counted.items()}
    for line in format_table(dict(_spent), counts, wall):
        write(line)
    slow = sorted(_tests.items(), key=lambda kv: -kv[1])
    record = os.environ.get("SPARKTRAIN_TEST_TIMES")
    if record and "PYTEST_XDIST_WORKER" not in os.environ:
        with Path(record).open("a", encoding="utf-8") as out:
            out.write(f"# {len(slow)} tests, {wall:.0f} s wall\n")
            out.writelines(f"{seconds:.2f}\t{nodeid}\n" for nodeid, seconds in slow)
    if wall < 60:
        return  # a run of a few tests: the table is enough
    write("slowest tests (setup + call + teardown):")
    for nodeid, seconds in slow[:15]:
        write(f"  {seconds:7.1f}s  {nodeid}")
