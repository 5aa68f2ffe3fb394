"""A tutorial started against a Spark Connect server (``--master sc://HOST:PORT``), as a user
runs it from a shell: a process of its own that is a Connect client and nothing more."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark


def test_digits_example_trains_through_a_connect_server(connect_server, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "sparktrain.examples.digits", "--master", connect_server]
    command += ["--np", "2", "--epochs", "1", "--out-dir", str(tmp_path / "out")]
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "Spark: started Spark Connect, local-cluster[2,1,1024]" in out
    assert "[rank 0] epoch 1: loss" in out  # rank 0's lines came back live
    assert "Test accuracy" in out and "after 1 epochs" in out
