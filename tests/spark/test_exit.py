"""A script that ends without ``spark.stop()`` (the README's blocks never call it) ends
quietly: sparktrain stops the SparkContexts its runs went on when the interpreter exits, so
a local-cluster's master and workers are told the application ended before its JVM goes.

Without that stop, the same script printed 280+ lines of Java traces (executors lost with
code 143, new ones launched into the shutdown, RPCs to closed channels) after it ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MARK = "=== the script's last line ==="
SCRIPT = f"""
import sys
from pyspark.sql import SparkSession
from sparktrain import SparkRunner

spark = (
    SparkSession.builder.master("local-cluster[2,1,1024]")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)

def rank():
    import sparktrain
    return sparktrain.rank()

print(SparkRunner(np=2).run_all(rank), flush=True)
sys.stderr.write({MARK!r} + "\\n")
sys.stderr.flush()
"""


def test_a_script_without_spark_stop_ends_quietly(tmp_path: Path) -> None:
    script = tmp_path / "no_stop.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[0, 1]"]
    before, found, after = proc.stderr.partition(MARK)
    assert found, proc.stderr[-3000:]
    assert after.strip().splitlines() == [], after[:3000]
