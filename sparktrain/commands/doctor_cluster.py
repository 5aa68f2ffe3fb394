"""``sparktrain doctor`` on a cluster: one small barrier stage over the executors, and a
report per host.

Each task runs :mod:`sparktrain.commands.doctor_host`, shipped as source so that it runs even where
the executor's sparktrain is missing or another version. The driver then compares: Python,
torch, cloudpickle and sparktrain must match its own (a function pickled with one Python
minor version does not load in another), and a checkpoint URL written from one host must be
readable from every other one.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparktrain.commands import doctor_host
from sparktrain.commands.doctor_probes import FAIL, OK, WARN, Check
from sparktrain.shipping.python_probe import executor_python, pin_python

CLUSTER_TIMEOUT = 120.0
SHARED_FIX = (
    "use a URL every host reaches (s3://…, gs://…, abfss://…) or a file system mounted on "
    "every host (NFS, /dbfs); a local path is a different disk on each host, and a restart "
    "on another host would start from scratch"
)


def executor_count(spark: Any) -> int:
    """How many executors are registered with the driver (in local mode, the driver's own)."""
    sc = spark.sparkContext
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    # The driver is listed too; in local mode it is the only one, and runs the tasks itself.
    return max(1, len(infos) - 1)


def probe_cluster(
    spark: Any,
    checkpoint: str | None = None,
    timeout: float = CLUSTER_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Run one barrier task per executor; every task's report, and how many executors the
    driver knows (when fewer slots are free, fewer tasks run, and the rest are missed).

    ``env`` is set in each task while it checks ``checkpoint`` (credentials, an endpoint).

    Raises:
        TimeoutError: the stage did not finish in ``timeout`` seconds (it is cancelled).
    """
    from sparktrain.driver.capacity import busy_slots, total_slots

    executors = executor_count(spark)
    n = max(1, min(executors, total_slots(spark.sparkContext) - busy_slots(spark.sparkContext)))
    source = Path(doctor_host.__file__).read_text(encoding="utf-8")
    token = uuid.uuid4().hex
    task_env = dict(env or {})

    def task(_: Iterator[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        namespace: dict[str, Any] = {"__name__": "sparktrain_doctor_host"}
        exec(compile(source, "sparktrain/commands/doctor_host.py", "exec"), namespace)  # noqa: S102
        yield json.dumps(namespace["probe"](BarrierTaskContext.get(), checkpoint, token, task_env))

    sc = spark.sparkContext
    group = f"sparktrain-doctor-{token[:12]}"
    out: dict[str, Any] = {}

    def body() -> None:
        sc.setJobGroup(group, "sparktrain doctor: one task per executor", True)
        try:
            rdd = sc.parallelize(range(n), n).barrier().mapPartitions(task)
            # The interpreter a run starts, to report on what a run would meet (unchecked: the
            # report is the check).
            pin_python(rdd, sc, executor_python(sc)[0])
            out["rows"] = rdd.collect()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=body, name="sparktrain-doctor", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        thread.join(30)
        raise TimeoutError(
            f"the doctor's barrier stage of {n} tasks did not finish in {timeout:g} s: "
            "is another job holding the executors?"
        )
    if "error" in out:
        raise out["error"]
    return [json.loads(row) for row in out["rows"]], executors


def version_mismatches(
    driver: Mapping[str, str | None], host: Mapping[str, str | None]
) -> list[str]:
    """How a host's versions differ from the driver's, one phrase each.

    Python must agree on major.minor; the packages exactly. A package the driver lacks is
    not compared.
    """
    problems = []
    for name, mine in driver.items():
        theirs = host.get(name)
        if mine is None:
            continue
        if name == "python":
            same = theirs is not None and theirs.split(".")[:2] == mine.split(".")[:2]
        else:
            same = theirs == mine
        if not same:
            problems.append(f"{name} {theirs or 'not installed'} (driver {mine})")
    return problems


def _versions_text(versions: Mapping[str, str | None]) -> str:
    return ", ".join(f"{name} {value or 'not installed'}" for name, value in versions.items())


def host_checks(
    reports: Sequence[Mapping[str, Any]], driver: Mapping[str, str | None]
) -> list[Check]:
    """Rows for each host: versions, GPUs, interfaces and the one sparktrain uses."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for report in sorted(reports, key=lambda r: (r["host"], r["executor"])):
        by_host.setdefault(report["host"], []).append(report)
    rows = []
    for host, tasks in by_host.items():
        name = f"host {host}"
        problems = sorted({p for t in tasks for p in version_mismatches(driver, t["versions"])})
        detail = f"{len(tasks)} executor(s); {_versions_text(tasks[0]['versions'])}"
        if problems:
            fix = (
                "give the executors the driver's versions (spark.pyspark.python / "
                "PYSPARK_PYTHON pointing at the same environment): a function pickled on "
                "the driver does not load under another Python minor version, and "
                "sparktrain's own messages change between versions"
            )
            text = f"{detail}; differs: {'; '.join(problems)}"
            rows.append(Check(name, FAIL, text, fix, essential=True))
        else:
            rows.append(Check(name, OK, detail, essential=True))
        gpus = "; ".join(
            f"{t['executor']}: {', '.join(t['gpus']) if t['gpus'] else 'none'}" for t in tasks
        )
        rows.append(Check(f"{name} gpus", OK, gpus))
        found: dict[str, list[str]] = tasks[0]["interfaces"]
        # Interfaces without an IPv4 address cannot carry the ranks' traffic: not listed.
        listed = ", ".join(
            f"{iface} {'/'.join(addrs)}" for iface, addrs in sorted(found.items()) if addrs
        )
        chosen = {t["chosen"] for t in tasks}
        if None in chosen:
            fix = (
                f"Spark knows this executor as {host!r}, which no interface holds: set "
                "SPARK_LOCAL_IP on the host, or GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME "
                "through SparkRunner(env=...)"
            )
            rows.append(Check(f"{name} network", WARN, f"{listed}; uses none", fix))
        else:
            rows.append(
                Check(
                    f"{name} network", OK, f"{listed}; sparktrain uses {', '.join(sorted(chosen))}"
                )
            )
    return rows


def checkpoint_check(url: str, reports: Sequence[Mapping[str, Any]]) -> Check:
    """Whether ``url`` was writable from the first task's host and readable from every host."""
    name = "checkpoint"
    writer = next(r for r in reports if r["index"] == 0)
    if writer.get("write_error"):
        detail = f"{url}: cannot write from {writer['host']}: {writer['write_error']}"
        fix = "check the URL, the credentials on the executors, and that the bucket exists"
        return Check(name, FAIL, detail, fix)
    hosts = sorted({r["host"] for r in reports})
    unread = sorted({f"{r['host']} ({r['read_error']})" for r in reports if r.get("read_error")})
    if unread:
        detail = f"{url}: written from {writer['host']}, but not readable on {', '.join(unread)}"
        return Check(name, FAIL, detail, SHARED_FIX)
    others = [h for h in hosts if h != writer["host"]]
    if not others:
        detail = f"{url}: writable; read back on {writer['host']}, the only host"
        return Check(name, WARN, detail, "run with executors on several hosts to check sharing")
    return Check(
        name, OK, f"{url}: written from {writer['host']}, read back on {', '.join(others)}"
    )


def cluster_checks(
    spark: Any,
    checkpoint: str | None = None,
    timeout: float = CLUSTER_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> list[Check]:
    """Every cluster row: one per host and aspect, the checkpoint URL's, and missed executors.

    A stage that fails or times out becomes one failed row with the reason.
    """
    try:
        reports, executors = probe_cluster(spark, checkpoint, timeout, env)
    except Exception as exc:  # noqa: BLE001 - shown as a row, like every probe
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        fix = (
            "a Python version that differs from the driver's fails every task: see the "
            "executors' logs; or free task slots for one task per executor"
        )
        return [Check("cluster", FAIL, f"barrier stage over the executors failed: {first}", fix)]
    master = spark.sparkContext.master
    hosts = sorted({r["host"] for r in reports})
    rows = [Check("cluster", OK, f"{master}: {len(reports)} executor(s) on {len(hosts)} host(s)")]
    probed = len({r["executor"] for r in reports})
    if probed < executors:
        detail = f"{executors - probed} of {executors} executors ran no task: not in this report"
        rows.append(Check("cluster", WARN, detail, "run the doctor again when the cluster is idle"))
    rows.extend(host_checks(reports, doctor_host.versions()))
    if checkpoint:
        rows.append(checkpoint_check(checkpoint, reports))
    return rows
