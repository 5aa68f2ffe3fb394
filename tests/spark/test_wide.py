"""The real path at width: 32 barrier tasks (4 executors of 8 cores), a DDP function and a
HorovodRunner function, each rank a real process. Runs in its own Spark application (a
subprocess): the shared session's two one-core executors hold two tasks at most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 32

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_ddp_and_horovod_on_32_tasks() -> None:
    script = ROOT / "tests" / "fixtures" / "scripts" / "wide_run.py"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(script), str(WIDTH)],
        capture_output=True,
        text=True,
        timeout=850,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    print(json.dumps(result, indent=1))  # the launch breakdown and memory, with -s
    for name in ("ddp", "horovod"):
        run = result[name]
        assert run["size"] == WIDTH  # every rank took part in the collective
        assert {"submit", "rendezvous", "training"} <= set(run["phases"])
        assert "function" in run["breakdown"]
        assert run["memory_mb"]["rank_rss"] > 0
