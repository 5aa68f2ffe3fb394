"""``sparktrain doctor``: what this machine has for sparktrain, and how to fix what it lacks.

The probes live in :mod:`sparktrain.commands.doctor_probes`; this module runs them in display order
and prints the table. Only Python and torch are essential; Java, pyspark, Horovod, MPI and
GPUs are needed by some runs only, so their absence is shown with its fix but does not fail
the command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from sparktrain.commands import doctor_probes as probes
from sparktrain.commands.doctor_probes import ESSENTIALS, FAIL, OK, SKIP, WARN, Check
from sparktrain.commands.doctor_spark import check_spark_session


def run_checks(
    spark: bool = False,
    session: Any = None,
    checkpoint: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Check]:
    """Every check, in display order; a probe that crashes becomes a failed row.

    Args:
        spark: also start a local SparkSession and run a barrier stage (slow).
        session: a SparkSession whose executors to check, host by host (see
            :mod:`sparktrain.commands.doctor_cluster`).
        checkpoint: a checkpoint URL to check from the executors: writable, and shared.
        env: environment the executors check ``checkpoint`` with (credentials, endpoint).
    """
    pyspark_version = probes.installed_pyspark_version()
    gpus, why = _safe(probes.probe_gpus, ([], "probe failed"))
    conf, where = _safe(probes.spark_defaults, ({}, None))
    checks: list[tuple[str, Callable[[], list[Check]]]] = [
        ("python", probes.check_python),
        ("sparktrain", probes.check_sparktrain),
        ("torch", lambda: probes.check_torch(gpus)),
        ("java", lambda: probes.check_java(pyspark_version)),
        ("pyspark", lambda: probes.check_pyspark(pyspark_version)),
        ("spark session", lambda: check_spark_session(spark, pyspark_version)),
        ("horovod", probes.check_horovod),
        ("mpirun", probes.check_mpirun),
        ("gpus", lambda: probes.check_gpus(gpus, why)),
        ("spark gpus", lambda: probes.check_spark_gpus(gpus, pyspark_version, conf, where)),
        ("cluster", lambda: _cluster(session, checkpoint, env)),
    ]
    rows: list[Check] = []
    for name, check in checks:
        try:
            rows.extend(check())
        except Exception as exc:  # noqa: BLE001 - one broken probe must not hide the others
            detail = f"the check itself failed: {type(exc).__name__}: {exc}"
            rows.append(Check(name, FAIL, detail, essential=name in ESSENTIALS))
    return rows


def _cluster(session: Any, checkpoint: str | None, env: Mapping[str, str] | None) -> list[Check]:
    if session is None:
        if checkpoint:
            detail = "the checkpoint URL is checked from the executors: give --master URL"
            return [Check("checkpoint", SKIP, detail)]
        return [Check("cluster", SKIP, "no cluster given (sparktrain doctor --master URL)")]
    from sparktrain.commands.doctor_cluster import cluster_checks

    return cluster_checks(session, checkpoint, env=env)


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - shown as absent
        return default


def missing_essentials(checks: Sequence[Check]) -> list[str]:
    """The names of the essential checks that failed."""
    return [c.name for c in checks if c.essential and c.status == FAIL]


def _marks(stream: TextIO) -> dict[str, str]:
    try:
        "✓✗".encode(getattr(stream, "encoding", None) or "utf-8")  # None: an in-memory stream
    except (LookupError, UnicodeEncodeError):
        return {OK: "ok", FAIL: "XX", WARN: "!", SKIP: "-"}
    return {OK: "✓", FAIL: "✗", WARN: "!", SKIP: "-"}


def render(checks: Sequence[Check], stream: TextIO) -> None:
    """Print the table: one row per check, the fix under each row that is not fine."""
    marks = _marks(stream)
    width = max([len(c.name) for c in checks] + [4]) + 2
    print("sparktrain doctor", file=stream)
    for check in checks:
        print(f"  {marks[check.status]:>2} {check.name:<{width}}{check.detail}", file=stream)
        if check.fix and check.status != OK:
            print(f"     {'':<{width}}fix: {check.fix}", file=stream)
    broken = missing_essentials(checks)
    if broken:
        print(f"\nmissing essentials: {', '.join(broken)} (see the fixes above)", file=stream)
    else:
        print(
            f"\nessentials ({', '.join(ESSENTIALS)}) are fine; the rest is needed only by the "
            "runs that use it",
            file=stream,
        )


def main(
    spark: bool = False,
    stream: TextIO | None = None,
    session: Any = None,
    checkpoint: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run every check and print the table.

    Args:
        spark: also start a local SparkSession and run a barrier stage (slow).
        stream: where the table goes (default: stdout).
        session: a SparkSession on the cluster to check, host by host (default: the active
            one, if any).
        checkpoint: a checkpoint URL to check from every host: writable, and shared.
        env: environment the executors check ``checkpoint`` with, as ``SparkRunner(env=...)``
            gives it to ranks (credentials, an endpoint).

    Returns:
        0 when the essentials (and every host's versions) are fine, else 1.
    """
    if session is None and "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    checks = run_checks(spark=spark, session=session, checkpoint=checkpoint, env=env)
    render(checks, stream or sys.stdout)
    return 1 if missing_essentials(checks) else 0
