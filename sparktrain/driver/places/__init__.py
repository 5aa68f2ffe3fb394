"""Where a run goes: the driver's own processes, a classic Spark session, or a Spark Connect
session, one object each (:class:`~sparktrain.driver.places.base.Place`).

What differs between them (reading the conf, the checks before a run, counting task slots and
sizing an attempt, the channel's address, starting the stage, what a restart needs) is asked of
the place; no code outside this folder asks which place a run goes to. :func:`place_for` is the
one place that does.
"""

from __future__ import annotations

from typing import Any

from sparktrain.driver.places.base import Place, Turn


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client (it has no SparkContext)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def place_for(session: Any, plans: dict[str, Any] | None = None) -> Place:
    """The place of a run on ``session``: None runs on the driver.

    Args:
        session: a classic or Spark Connect SparkSession, or None.
        plans: what earlier runs of one runner found of each Connect session (by id); the
            place reads and keeps its own there.
    """
    if session is None:
        from sparktrain.driver.places.local import LocalPlace

        return LocalPlace()
    if is_connect(session):
        from sparktrain.driver.places.connect import ConnectPlace

        return ConnectPlace(session, {} if plans is None else plans)
    from sparktrain.driver.places.classic import ClassicPlace

    return ClassicPlace(session)


__all__ = ["Place", "Turn", "is_connect", "place_for"]
