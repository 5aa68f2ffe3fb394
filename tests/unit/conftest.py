"""Fixtures of the shared-host tests: a stand-in for the shared temporary folder, and another
local account (see tests/accounts.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
