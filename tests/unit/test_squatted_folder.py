"""Another account that takes the name of a user's private folder first (a ``mkdir`` in the
shared temporary folder) cannot stop that user's runs: task folders, the data cache and kept
results go to a fallback folder of the user's alone, reused by later runs, with a warning
naming the squatter. Acted out by a real second account in a stand-in for ``/tmp``."""

from __future__ import annotations

import logging
import os
import pickle
import stat
from pathlib import Path

import pytest

import sparktrain
from sparktrain import SparkRunner, private_dir
from sparktrain.data.converter import default_cache_dir
from sparktrain.shipping.payload import keep_and_say
from tests.accounts import Account
from tests.fixtures import host_files


def _squat(other: Account, tmp: Path) -> Path:
    """The other account makes the user's private folder's name first, open to everyone."""
    taken = tmp / f"{private_dir.PREFIX}{os.getuid()}"
    other.run("mkdir", "-m", "0777", str(taken))
    return taken


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_squatted_private_folder_does_not_stop_a_local_run(
    tmp: Path, other: Account, caplog: pytest.LogCaptureFixture
) -> None:
    taken = _squat(other, tmp)
    caplog.set_level(logging.WARNING, logger="sparktrain")

    first = SparkRunner(np=-2, progress=False).run(host_files.own_folder)
    second = SparkRunner(np=-2, progress=False).run(host_files.own_folder)

    tasks = Path(first["own_folder"]).parent
    fallback = tasks.parent
    assert tasks.name == "tasks" and fallback.parent == tmp
    assert fallback.name.startswith(
        f"{private_dir.PREFIX}{os.getuid()}{private_dir.FALLBACK_INFIX}"
    )
    info = os.lstat(fallback)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert Path(second["own_folder"]).parent == tasks  # the next run reuses it
    said = [m for m in _warnings(caplog) if f"sparktrain uses {fallback} for its files" in m]
    assert said, _warnings(caplog)
    assert f"{taken} is not yours (owner {other.name} (uid {other.uid})" in said[0]
    assert "0o777" in said[0] and "set TMPDIR" in said[0]
    assert os.listdir(taken) == []  # nothing of the user's went into the squatter's folder


def test_the_data_cache_and_kept_results_use_the_same_fallback(
    tmp: Path, other: Account, caplog: pytest.LogCaptureFixture
) -> None:
    _squat(other, tmp)
    caplog.set_level(logging.WARNING, logger="sparktrain")
    cache = Path(default_cache_dir().removeprefix("file://"))
    message = keep_and_say(pickle.dumps({"w": 1}), "r9-attempt1-rank0")
    kept = Path(message.split("it is kept in ")[1].split(" (")[0])
    assert cache.name == "cache" and kept.parent.name == "results"
    assert cache.parent == kept.parent.parent and cache.parent.parent == tmp
    assert sparktrain.load_kept(kept) == {"w": 1}
    assert any(f"owner {other.name}" in m for m in _warnings(caplog))


def test_a_folder_named_like_a_fallback_by_another_account_is_never_used(
    tmp: Path, other: Account
) -> None:
    _squat(other, tmp)
    decoy = tmp / f"{private_dir.PREFIX}{os.getuid()}{private_dir.FALLBACK_INFIX}0000"
    other.run("mkdir", "-m", "0777", str(decoy))
    chosen = private_dir.usable_root()
    assert chosen != decoy and chosen.parent == tmp
    assert os.lstat(chosen).st_uid == os.getuid() and os.listdir(decoy) == []


def test_a_temporary_folder_others_can_rename_in_is_still_refused(tmp_path: Path) -> None:
    # No folder in it could be private (others may rename it away): no fallback, the error.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(private_dir.NotPrivateError, match="without the sticky bit"):
        private_dir.usable_root(open_dir)
