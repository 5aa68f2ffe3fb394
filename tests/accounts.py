"""Another local account on the same host, for tests that act as it.

Tests run as root here, so they can make throwaway accounts (``useradd``) and act as them
(``runuser``); where that is impossible they skip, saying why. The shared temporary folder is
a stand-in for ``/tmp`` (mode 1777, under ``/tmp`` so other accounts can reach it; its own
random name), so planting files never disturbs other runs on the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import sparktrain

CHECKOUT = Path(sparktrain.__file__).resolve().parents[1]
# An interpreter other accounts may run (pyenv's under /root is not), and the venv's packages.
SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGES = sysconfig.get_paths()["purelib"]


def need_root() -> None:
    """Skip unless this process can make accounts and act as them."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local account needs root (useradd, runuser)")
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"acting as another local account needs {tool}")


@dataclasses.dataclass(frozen=True)
class Account:
    """A throwaway account: its name and uid, and how to run a command as it."""

    name: str
    uid: int

    def run(
        self, *argv: str, env: Mapping[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as this account, with a clean environment plus ``env``."""
        clean = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}
        return subprocess.run(
            ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in clean.items())]
            + list(argv),
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def python(
        self, code: str, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``code`` in the system Python as this account, importing this checkout."""
        path = {"PYTHONPATH": f"{CHECKOUT}{os.pathsep}{PACKAGES}", **(env or {})}
        return self.run(SYSTEM_PYTHON, "-c", code, env=path)


def need_python(account: Account) -> None:
    """Skip unless ``account`` can run Python and import this checkout and its packages."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"another account needs an interpreter it can run; {SYSTEM_PYTHON} is absent")
    probe = account.run(
        SYSTEM_PYTHON,
        "-c",
        "import sys, sparktrain.shipping.payload; print(sys.version_info[:2])",
        env={"PYTHONPATH": f"{CHECKOUT}{os.pathsep}{PACKAGES}"},
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(
            f"account {account.name} cannot import sparktrain from {CHECKOUT} with "
            f"{SYSTEM_PYTHON} (a checkout under /root is not readable by other accounts, or "
            f"the Python versions differ): {probe.stderr.strip()[-300:] or probe.stdout}"
        )


@contextlib.contextmanager
def account() -> Iterator[Account]:
    """A new account with no home folder, removed afterwards."""
    need_root()
    name = f"st{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True
    )
    try:
        yield Account(name, pwd.getpwnam(name).pw_uid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def shared_tmp() -> Iterator[Path]:
    """A folder every account can write, sticky, like ``/tmp``; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="st-host-", dir="/tmp"))
    try:
        path.chmod(0o1777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
