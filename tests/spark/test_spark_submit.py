"""Spark applications that use sparktrain: through spark-submit, and through `sparktrain run`.

Both run in subprocesses with their own SparkContext, so they need no session fixture.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparktrain.shipping.payload import load_kept

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
FIXTURES = ROOT / "tests" / "fixtures"
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Java 17+ is needed for Spark tests (openjdk-17-jre-headless)",
    ),
]


def output(done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit code {done.returncode}\n--- stdout ---\n{done.stdout[-4000:]}\n"
        f"--- stderr ---\n{done.stderr[-6000:]}"
    )


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env["PYSPARK_PYTHON"] = sys.executable  # executors need this venv
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def submit_argv() -> list[str]:
    """spark-submit on a local-cluster of two executors, the UI off, this venv for Python."""
    return [
        str(SPARK_SUBMIT),
        "--master",
        "local-cluster[2,1,1024]",
        "--conf",
        "spark.ui.enabled=false",
        # Executor JVMs can take over the default 30 s to register on a loaded machine.
        "--conf",
        "spark.sparktrain.capacityWait=120s",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
    ]


@pytest.mark.slow
@pytest.mark.skipif(not SPARK_SUBMIT.exists(), reason=f"{SPARK_SUBMIT} not found")
def test_spark_submit_application_trains_with_spark_runner(tmp_path):
    log4j = f"-Dlog4j2.configurationFile=file:{CONF}/log4j2.properties"
    done = subprocess.run(
        [
            *submit_argv(),
            "--conf",
            f"spark.driver.extraJavaOptions={log4j}",
            "--conf",
            f"spark.executor.extraJavaOptions={log4j}",
            str(FIXTURES / "submit_job.py"),
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, output(done)
    match = re.search(
        r"^SUBMIT_RESULT world=(\d+) first=(\S+) last=(\S+) master=(\S+)$",
        done.stdout,
        re.MULTILINE,
    )
    assert match, output(done)
    world, first, last, master = match.groups()
    assert world == "2" and master == "local-cluster[2,1,1024]"
    assert float(last) < 0.01 * float(first)  # both ranks trained one model: it converged


@pytest.mark.skipif(not SPARK_SUBMIT.exists(), reason=f"{SPARK_SUBMIT} not found")
def test_a_failed_job_ends_with_sparktrains_error(tmp_path):
    """With Spark's own logging (no quiet log4j file), the job of the README's shape prints
    the root cause last: no Spark shutdown line after it. Its rank 1 fails once rank 0 has
    finished, so rank 0's result is on its way to the driver as the run is stopped: the
    driver collects it and keeps it, and the error names the file."""
    (tmp_path / "handshake").mkdir()
    env = child_env()
    env["TMPDIR"] = str(tmp_path)  # the driver keeps rank 0's result in its private folder
    done = subprocess.run(
        [*submit_argv(), str(FIXTURES / "scripts" / "failing_job.py"), "handshake"],
        cwd=tmp_path,
        env=env,
        # One stream, as a terminal shows it (spark-submit passes the Python app's stderr on
        # to its stdout, and Spark logs to stderr).
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=280,
    )
    shown = done.stdout.rstrip().splitlines()
    assert done.returncode == 1, "\n".join(shown[-80:])
    first = max(i for i, line in enumerate(shown) if line.startswith("WorkerFailedError: "))
    after = shown[first:]
    kept = re.fullmatch(
        r"WorkerFailedError: 1 rank\(s\) failed \(of the results that reached the driver, "
        r"rank 0's: it is kept in (\S+\.pkl) \(sparktrain\.load_kept\(path\) reads it back; "
        r"a run on this host removes it once it is older than kept_results_ttl "
        r"\(spark\.sparktrain\.keptResultsTtl, 3 days unless set\); `sparktrain kept clean` "
        r"removes kept results at once\)\)\. Root cause:",
        after[0],
    )
    assert kept is not None, after
    assert Path(kept.group(1)).is_relative_to(tmp_path)
    assert load_kept(kept.group(1)) == "finished first"
    assert not any("did not reach the driver" in line for line in after), after
    assert any(
        line.startswith("rank 1 on ")
        and line.endswith("raised ValueError: rank 1 could not find its data")
        for line in after
    ), after
    assert after[-1] == "ValueError: rank 1 could not find its data", after
    assert not any(" INFO " in line or " WARN " in line for line in after), after


def test_sparktrain_run_command_on_local_spark(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparktrain",
            "run",
            "--np",
            "2",
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            str(FIXTURES / "cli_script.py"),
            "--",
            "--flag",
            "y",
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, output(done)
    for rank in (0, 1):
        assert (
            f"[rank {rank}] cli_script rank {rank}/2 sum=3 argv=['--flag', 'y'] name=__main__"
        ) in done.stdout
