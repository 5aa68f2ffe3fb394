"""A host dies mid-training: its Worker, executors and ranks are SIGKILLed at once.

With ``max_restarts=1`` the run starts again once the host is back (a fresh machine: its
disk is empty, its Worker registers anew) and resumes from the newest checkpoint on shared
storage (S3), doing each step after it exactly once. The cluster is whole again afterwards,
so the tier's other tests may run after this one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.checkpoint import load_latest
from tests.cluster.conftest import EXECUTORS_PER_HOST, HOSTS
from tests.conftest import wait_for_executors
from tests.fixtures import host_loss

pytestmark = pytest.mark.cluster

NP = HOSTS * EXECUTORS_PER_HOST


def _kill_host_when_ranks_wait(runner: SparkRunner, cluster: Any, host: Any, out: dict) -> None:
    """Once every rank waits at the kill point, kill ``host`` and bring its Worker back."""
    deadline = time.monotonic() + host_loss.KILL_WAIT
    try:
        while sum(host_loss.AT_KILL_POINT in r["metrics"] for r in runner.history) < NP:
            if time.monotonic() > deadline:
                raise RuntimeError("the ranks never all reached the kill point")
            time.sleep(0.1)  # the run fills runner.history from its own thread
        cluster.hosts.kill_host(host)
        out["killed"] = time.monotonic()
        cluster.restart_worker(host)
        out["back"] = time.monotonic()
    except BaseException as exc:  # noqa: BLE001 - re-raised by the test
        out["error"] = exc


def test_lost_host_restarts_from_s3_with_exact_steps(cluster, cluster_spark, cluster_s3, caplog):
    url = f"s3://{cluster_s3.new_bucket('hostloss')}/run"
    victim = cluster.hosts.hosts[-1]
    # The host's executors come back as a new Worker's JVMs: as long as the tier allows anywhere
    # for executors to register (120 s), not the default 60 s (over it beside two other suites).
    runner = SparkRunner(
        np=NP,
        max_restarts=1,
        grace_period=2,
        capacity_wait=120,
        env=cluster_s3.env,
        progress=False,
    )
    out: dict[str, Any] = {}
    killer = threading.Thread(
        target=_kill_host_when_ranks_wait, args=(runner, cluster, victim, out), daemon=True
    )
    killer.start()
    try:
        result = runner.run(host_loss.train, url, epochs=4, steps_per_epoch=3, kill_at=(2, 1))
    finally:
        killer.join(timeout=120)
        # Whatever happened, the next test needs all four executors back.
        wait_for_executors(cluster_spark, NP, 120, cluster.executor_logs)
    assert "error" not in out, out.get("error")
    assert "killed" in out, "the host was never killed"

    assert result == {"steps": 12, "size": NP, "attempt": 1, "agree": True}
    first, second = runner.attempts
    # The lost ranks are the cause, named with the dead host; not the survivors' broken
    # collectives nor their stop.
    assert "its Spark task vanished" in first.cause, first.cause
    assert f"on {victim.address}" in first.cause, first.cause
    assert second.error is None
    assert "attempt 1/2 failed" in caplog.text

    for rank in range(NP):
        rows = [r for r in runner.history if r["rank"] == rank]
        epochs = [
            (int(r["metrics"]["attempt"]), r["epoch"], r["step"])
            for r in rows
            if r["epoch"] is not None and host_loss.AT_KILL_POINT not in r["metrics"]
        ]
        # Epoch 2 started twice: in attempt 0 (lost with the host) and again from the
        # checkpoint of step 6; nothing before it ran again, nothing after it ran twice.
        assert epochs == [(0, 0, 0), (0, 1, 3), (0, 2, 6), (1, 2, 6), (1, 3, 9)], (rank, epochs)
        steps = {
            a: [r["step"] for r in rows if "done" in r["metrics"] and r["metrics"]["attempt"] == a]
            for a in (0, 1)
        }
        assert steps == {0: [1, 2, 3, 4, 5, 6, 7], 1: [7, 8, 9, 10, 11, 12]}, (rank, steps)

    newest = load_latest(url, storage_options=cluster_s3.storage_options)
    assert newest is not None and newest.step == 12 and newest.state["epoch"] == 3
