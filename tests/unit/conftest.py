"""Fixtures of the shared-host tests: a stand-in for the shared temporary folder, and another
local account (see tests/accounts.py)."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparktrain.task.process import RankProcess
from tests.accounts import Account, account, shared_tmp


@pytest.fixture
def tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The shared temporary folder, as TMPDIR of this process and the ranks it starts."""
    with shared_tmp() as path:
        monkeypatch.setenv("TMPDIR", str(path))
        monkeypatch.setattr(tempfile, "tempdir", str(path))
        yield path


@pytest.fixture
def other() -> Iterator[Account]:
    """A throwaway local account (skips where accounts cannot be made)."""
    with account() as found:
        yield found


@pytest.fixture
def started() -> Iterator[list[RankProcess]]:
    """RankProcesses a test starts; any still alive at the end are killed by process group."""
    procs: list[RankProcess] = []
    yield procs
    for proc in procs:
        if proc.proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.join(5)
