"""RankProcess.dump_stack: a real process dumps its main thread's stack on request and runs on;
one that cannot answer is never sent the signal (it would end it)."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sparktrain import stacks
from sparktrain.task import stackpipe
from sparktrain.task.process import RankProcess, stop_all

# A worker's way of answering, then a function that naps where the test can find it.
ANSWERS = """
    import time
    from sparktrain.worker import bootstrap

    def napping():
        print("ready", flush=True)
        time.sleep(60)

    bootstrap._answer_stack_requests()
    napping()
"""
NEVER_ANSWERS = """
    import time
    print("ready", flush=True)
    time.sleep(60)
"""


class Lines:
    def __init__(self) -> None:
        self.ready = threading.Event()
        self.exits: list[int] = []

    def on_line(self, rank: int, line: str) -> None:
        if line == "ready":
            self.ready.set()

    def on_exit(self, rank: int, code: int) -> None:
        self.exits.append(code)


def spawn(started: list[RankProcess], tmp_path: Path, code: str, rank: int = 0) -> RankProcess:
    lines = Lines()
    proc = RankProcess(
        rank,
        [sys.executable, "-c", textwrap.dedent(code)],
        dict(os.environ),
        str(tmp_path),
        on_line=lines.on_line,
        on_exit=lines.on_exit,
        dumps_stacks=True,
    )
    started.append(proc)
    assert lines.ready.wait(30), "the process never got ready"
    return proc


def test_a_rank_dumps_its_stack_and_runs_on(started: list[RankProcess], tmp_path: Path) -> None:
    proc = spawn(started, tmp_path, ANSWERS)
    for _ in range(2):  # as often as asked
        stack = proc.dump_stack(timeout=10)
        assert stack is not None
        assert stack.frames[0].name == "napping" and stack.frames[-1].name == "<module>"
        assert stacks.where(stack, lambda path, line: "time.sleep(60)") == (
            f"in napping at <string>:{stack.frames[0].line}: time.sleep(60)"
        )
        assert proc.proc.poll() is None
    assert proc.last_stack == stack


def test_a_process_that_cannot_answer_is_not_signalled(
    started: list[RankProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = spawn(started, tmp_path, NEVER_ANSWERS)
    assert proc._stacks is not None
    cond = proc._stacks._cond
    waits: list[float | None] = []
    signals: list[str] = []
    wait_for = cond.wait_for

    def logged_wait(predicate: Callable[[], object], timeout: float | None = None) -> object:
        waits.append(timeout)
        return wait_for(predicate, timeout)

    monkeypatch.setattr(cond, "wait_for", logged_wait)
    monkeypatch.setattr(proc, "_send_dump_signal", lambda: signals.append("sent") or True)
    assert proc.dump_stack(timeout=10) is None
    # It knew without using the 10 s: one wait for the header, at most HEADER_WAIT long.
    assert len(waits) == 1 and waits[0] is not None and waits[0] <= stackpipe.HEADER_WAIT
    assert signals == []
    assert proc.proc.poll() is None  # SIGUSR1 would have ended it


def test_stop_all_dumps_every_stack_before_stopping_any(
    started: list[RankProcess], tmp_path: Path
) -> None:
    procs = [spawn(started, tmp_path, ANSWERS, rank=r) for r in range(2)]
    stop_all(procs, grace=1.0, stack_wait=10.0)
    for proc in procs:
        assert proc.join(10)
        assert proc.stopped_by_supervisor
        assert proc.last_stack is not None and proc.last_stack.frames[0].name == "napping"
