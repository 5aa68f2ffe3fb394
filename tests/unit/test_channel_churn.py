"""A stranger churning keyless connections at the driver's channel, from before the tasks
connect until after the run: every run still returns its value with every rank's reports, and
the driver's log counts what it dropped."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparktrain import SparkRunner
from sparktrain.driver.channel import ChannelServer

CHURN = Path(__file__).resolve().parents[1] / "fixtures" / "churn.py"
RUNS = 3
REPORTS = 12
COUNTS = re.compile(
    r"sparktrain-channel: (?P<dropped>\d+) connection\(s\) dropped .*?, "
    r"(?P<left>\d+) closed by their peer"
)


def _report_and_return() -> str:
    import sparktrain

    for step in range(REPORTS):
        sparktrain.report(step=step, loss=1.0 / (step + 1))
    return f"rank {sparktrain.rank()} of {sparktrain.world_size()}"


@pytest.mark.parametrize("opening", ["silent", "one byte"])
def test_a_connection_churn_fails_no_run_and_loses_no_report(
    opening: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sparktrain.wire")
    for _ in range(RUNS):
        channels: list[ChannelServer] = []
        floods: list[subprocess.Popen[str]] = []

        def start_flood(server: ChannelServer, channels=channels, floods=floods) -> None:
            # Called once the channel listens, before the local supervisor connects: the
            # flood is on (its first connections held) before any task says hello.
            channels.append(server)
            host, _, port = server.address.rpartition(":")
            flood = subprocess.Popen(
                [sys.executable, str(CHURN), host, port, "--seconds", "60"]
                + (["--byte"] if opening == "one byte" else []),
                stdout=subprocess.PIPE,
                text=True,
            )
            floods.append(flood)
            assert flood.stdout is not None
            assert flood.stdout.readline() == "churning\n"

        runner = SparkRunner(np=-2, progress=False, start_timeout=60, stall_timeout=None)
        runner._channel_hook = start_flood
        try:
            assert runner.run(_report_and_return) == "rank 0 of 2"
        finally:
            for flood in floods:
                flood.terminate()
                flood.wait(30)
        (flood,) = floods
        assert flood.returncode == -15  # it was still churning when the run ended
        steps = sorted((r["rank"], r["step"]) for r in runner.history)
        assert steps == [(rank, step) for rank in range(2) for step in range(REPORTS)]
        (channel,) = channels
        # The flood filled the channel's waiting room (its first connections alone do).
        assert channel.rejected + channel.abandoned >= channel.max_pending
        # The log's counts add up to what the channel dropped and what its peers left.
        said = [
            COUNTS.search(r.getMessage()) for r in caplog.records if r.name == "sparktrain.wire"
        ]
        assert sum(int(m["dropped"]) for m in said if m) == channel.rejected
        assert sum(int(m["left"]) for m in said if m) == channel.abandoned
        caplog.clear()
