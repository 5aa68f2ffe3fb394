"""The per-tier time table printed at the end of a run."""

from __future__ import annotations

from tests.tier_times import format_table, tier_of


def test_a_test_belongs_to_the_folder_under_tests() -> None:
    assert tier_of("tests/spark/test_runner.py::test_x[a/b]") == "spark"
    assert tier_of("tests/unit/sub/test_y.py::test_z") == "unit"
    assert tier_of("tests/test_top.py::t") == "other"
    assert tier_of("elsewhere/test_w.py::t") == "other"


def test_the_table_orders_tiers_by_time_and_gives_the_wall_clock() -> None:
    lines = format_table({"unit": 200.0, "spark": 1700.5}, {"unit": 1500, "spark": 300}, 1990.0)
    assert lines[0].split() == ["tier", "tests", "time", "share"]
    assert lines[1].split() == ["spark", "300", "28:20", "89%"]
    assert lines[2].split() == ["unit", "1500", "3:20", "11%"]
    assert lines[3].split() == ["all", "1800", "33:10", "(wall", "clock)"]
