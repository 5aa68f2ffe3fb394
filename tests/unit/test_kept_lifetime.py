"""Kept results have a lifetime: a run removes its user's results older than
``kept_results_ttl`` on its host (never failing for it), ``sparktrain kept list`` and
``sparktrain kept clean [--older-than]`` show and remove them, and the messages that say a
result was kept say how long it stays and how to remove it. Only this user's own files are
ever listed or removed."""

from __future__ import annotations

import logging
import os
import pickle
import time
from pathlib import Path

import pytest

from sparktrain import SparkRunner, private_dir
from sparktrain.commands import cli
from sparktrain.shipping import kept
from sparktrain.shipping.payload import keep_and_say, keep_result
from tests.accounts import Account
from tests.fixtures import host_files

DAY = 86400.0


def _age(path: Path, days: float) -> None:
    """Make ``path`` look written ``days`` ago."""
    when = time.time() - days * DAY
    os.utime(path, (when, when))


def _kept_files(tmp: Path) -> list[Path]:
    return sorted((tmp / f"{private_dir.PREFIX}{os.getuid()}" / "results").glob("*.pkl"))


def test_the_message_of_a_kept_result_says_how_long_it_stays_and_how_to_remove_it(
    tmp: Path,
) -> None:
    message = keep_and_say(pickle.dumps(1), "m1-attempt1-rank0")
    assert "sparktrain.load_kept(path) reads it back" in message
    assert "removes it once it is older than kept_results_ttl" in message
    assert "spark.sparktrain.keptResultsTtl, 3 days unless set" in message
    assert "`sparktrain kept clean` removes kept results at once" in message


def test_a_run_removes_kept_results_older_than_the_ttl_and_keeps_the_rest(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = keep_result(pickle.dumps("old"), "old-attempt1-rank0")
    young = keep_result(pickle.dumps("young"), "young-attempt1-rank0")
    _age(old, 4)
    _age(young, 2)
    caplog.set_level(logging.INFO, logger="sparktrain")

    SparkRunner(np=-1, progress=False).run(host_files.own_folder)  # the default: 3 days

    assert _kept_files(tmp) == [young]
    assert any("removed 1 kept result(s) older than 3d" in r.getMessage() for r in caplog.records)
    SparkRunner(np=-1, progress=False, kept_results_ttl="1d").run(host_files.own_folder)
    assert _kept_files(tmp) == []


def test_kept_results_are_left_when_the_ttl_is_none(tmp: Path) -> None:
    old = keep_result(pickle.dumps("old"), "old-attempt1-rank0")
    _age(old, 400)
    SparkRunner(np=-1, progress=False, kept_results_ttl="none").run(host_files.own_folder)
    assert _kept_files(tmp) == [old]


def test_a_failing_sweep_does_not_fail_the_run(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: object, **_kwargs: object) -> list[kept.Kept]:
        raise PermissionError("the results folder cannot be listed")

    monkeypatch.setattr(kept, "listing", broken)
    caplog.set_level(logging.WARNING, logger="sparktrain")
    value = SparkRunner(np=-1, progress=False).run(host_files.own_folder)
    assert value["own_folder"]
    assert any(
        "could not look for kept results" in r.getMessage()
        and "the results folder cannot be listed" in r.getMessage()
        for r in caplog.records
    )


def _cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_kept_list_and_clean_on_the_command_line(
    tmp: Path, other: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    first = keep_result(b"x" * 300, "a-attempt1-rank0")
    second = keep_result(b"y" * 200, "b-attempt1-rank0")
    _age(first, 5)
    _age(second, 1)
    # Another account's things beside them are never listed or removed.
    theirs = tmp / f"{private_dir.PREFIX}{other.uid}"
    other.run("mkdir", "-m", "0700", str(theirs))
    other.run("touch", str(tmp / f"{private_dir.PREFIX}{os.getuid()}-results-x.pkl"))

    code, out, err = _cli("kept", "list", capsys=capsys)
    assert code == 0
    lines = out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(first), str(second)]
    assert lines[0].split("\t")[1] == "300 bytes" and lines[0].endswith("5.0d old")
    assert "2 kept result(s), 500 bytes" in err

    code, out, err = _cli("kept", "clean", "--older-than", "3d", capsys=capsys)
    assert code == 0 and out == f"removed {first}\n"
    assert "removed 1 kept result(s), 300 bytes" in err
    assert not first.exists() and second.exists()

    code, out, err = _cli("kept", "clean", "--older-than", "soon", capsys=capsys)
    assert code == 2 and "--older-than: not a duration: 'soon'" in err and second.exists()

    code, out, _err = _cli("kept", "clean", capsys=capsys)
    assert code == 0 and out == f"removed {second}\n" and _kept_files(tmp) == []
    assert theirs.is_dir() and (tmp / f"{private_dir.PREFIX}{os.getuid()}-results-x.pkl").exists()


def test_kept_results_in_a_fallback_folder_are_listed_and_removed_too(
    tmp: Path, other: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    other.run("mkdir", "-m", "0777", str(tmp / f"{private_dir.PREFIX}{os.getuid()}"))
    message = keep_and_say(pickle.dumps(2), "f-attempt1-rank0")
    path = Path(message.split("it is kept in ")[1].split(" (")[0])
    assert path.parent.parent.name.startswith(f"{private_dir.PREFIX}{os.getuid()}-alt-")
    assert [k.path for k in kept.listing()] == [path]
    code, out, _err = _cli("kept", "clean", capsys=capsys)
    assert code == 0 and out == f"removed {path}\n" and not path.exists()
