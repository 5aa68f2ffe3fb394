"""A rank that floods its output: the other ranks' lines still arrive, what is not shown is
counted and said, the task holds a bounded number of lines, and log_dir keeps every line."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain.driver.lines import LineView
from sparktrain.task import logs
from sparktrain.task.logs import LogForwarder

FLOOD_SECONDS = 1.5


def _flood_and_talk(at_least: int, quiet_done: str) -> int:
    """Rank 1 floods until it printed ``at_least`` lines and rank 0 said all it had to say
    (a count, not a time: on a busy machine a flood of a fixed time can stay under the burst
    allowance, and then nothing is held back); rank 0 says 15 lines over the flood."""
    import os
    import sys
    import time

    rank = int(os.environ["RANK"])
    if rank == 1:
        n = 0
        deadline = time.monotonic() + 120
        while n < at_least or not os.path.exists(quiet_done):
            if time.monotonic() > deadline:
                raise RuntimeError("rank 0 did not finish its quiet lines in 120 s")
            for _ in range(1000):
                print(f"flood {n}")
                n += 1
        print(f"flood done {n}")
        return n
    for i in range(15):
        print(f"quiet {i}")
        sys.stdout.flush()
        time.sleep(FLOOD_SECONDS / 15)
    open(quiet_done, "w").close()
    return -1


def test_a_flooding_rank_does_not_drown_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = SparkRunner(np=-2, log_dir=str(tmp_path))
    runner.run(_flood_and_talk, 3 * logs.BURST, str(tmp_path / "quiet-done"))
    out = capsys.readouterr().out
    # Every line of the quiet rank reached the driver.
    for i in range(15):
        assert f"[rank 0] quiet {i}\n" in out
    # The flood did not, and the driver says so, naming the file that holds it all.
    files = list(tmp_path.glob("*/attempt-1/rank-1.log"))
    assert len(files) == 1
    kept = files[0].read_text().splitlines()
    total = int(kept[-1].split()[-1])
    assert total > 2 * logs.BURST  # it did flood
    assert kept[:-1] == [f"flood {n}" for n in range(total)]  # log_dir: nothing dropped
    shown = out.count("[rank 1] flood ")
    assert shown < total
    notices = [line for line in out.splitlines() if "lines not shown" in line]
    assert notices and all(line.startswith("[rank 1] ") for line in notices)
    assert f"full output in {files[0]}" in notices[-1]
    said = sum(int(line.split()[2].replace(",", "")) for line in notices)
    assert said + shown == total + 1  # every line is either shown or counted ("done" too)


def test_the_forwarder_never_waits_and_holds_a_bounded_queue() -> None:
    sent: list[dict[str, Any]] = []
    release = threading.Event()

    def send(message: dict[str, Any]) -> None:
        release.wait(10)  # the driver takes nothing for now
        sent.append(message)

    forwarder = LogForwarder(send, lambda rank: f"/logs/rank-{rank}.log", rate=1e9, max_queued=50)
    for i in range(10_000):  # returns at once each time, though nothing is sent
        forwarder.line(3, f"line {i}")
    assert len(forwarder._queue) <= 50
    release.set()
    forwarder.close()
    lines = [x for m in sent for x in m["lines"]]
    dropped = sum(m["dropped"] for m in sent)
    assert len(lines) + dropped == 10_000
    assert lines[:10] == [f"line {i}" for i in range(10)]
    assert any(m["where"] == "/logs/rank-3.log" for m in sent if m["dropped"])


def test_each_rank_has_its_own_budget() -> None:
    sent: list[dict[str, Any]] = []
    forwarder = LogForwarder(sent.append, rate=0.001, burst=100)
    for i in range(1000):
        forwarder.line(1, f"flood {i}")
    for i in range(50):
        forwarder.line(0, f"quiet {i}")
    forwarder.close()
    by_rank: dict[int, list[str]] = {0: [], 1: []}
    for message in sent:
        by_rank[message["rank"]] += message["lines"]
    assert by_rank[0] == [f"quiet {i}" for i in range(50)]
    assert len(by_rank[1]) == 100
    assert sum(m["dropped"] for m in sent if m["rank"] == 1) == 900


def test_a_very_long_line_is_shortened_and_says_so() -> None:
    sent: list[dict[str, Any]] = []
    forwarder = LogForwarder(sent.append)
    forwarder.line(0, "x" * (logs.MAX_LINE + 10))
    forwarder.close()
    (line,) = sent[0]["lines"]
    assert line.endswith("[... 10 more characters not shown]")
    assert forwarder.shortened == 1


def test_the_driver_says_what_was_not_shown_at_most_now_and_then() -> None:
    shown: list[str] = []
    view = LineView(shown.append)
    for _ in range(100):
        view.batch({"rank": 17, "lines": ["a"], "dropped": 12_043, "where": "/l/rank-17.log"})
    view.finish()
    notices = [s for s in shown if "not shown" in s]
    assert notices[0] == (
        "[rank 17] 12,043 lines not shown: more than a rank may send to the driver "
        "(1,000 lines/s); full output in /l/rank-17.log"
    )
    assert len(notices) == 2  # the first, and what remained at the end
    assert "1,204,300 in all" in notices[-1]
    assert view.not_shown == {17: 1_204_300}
