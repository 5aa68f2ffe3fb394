"""What users of TorchDistributor and horovod.spark.run do, on the driver (np < 0) or refused
before anything starts: a script instead of a function, the ranks' working directory, and
the application settings a run is checked against (GPUs, encryption)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner, private_dir
from sparktrain.errors import ConfigurationError, PayloadError, WorkerFailedError
from sparktrain.task import workdirs

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "scripts" / "porting_train.py"


def _work_dirs() -> set[str]:
    """The task folders this process owns (np < 0: the driver is the ranks' task); other
    processes on the machine make and remove their own meanwhile."""
    pattern = f"task-*-{os.getpid()}-*"
    return {p.name for p in private_dir.folder(workdirs.TASKS).glob(pattern)}


def test_script_runs_on_every_rank_with_its_argv(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative path, as TorchDistributor users write it
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    before = _work_dirs()
    result = SparkRunner(np=-2).run("train.py", str(tmp_path), "0.01")
    assert result is None
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen["argv"] == [str(tmp_path), "0.01"] and seen["name"] == "__main__"
        assert seen["sum"] == 3.0 and seen["lr"] == 0.01
        # Ranks start where the driver runs (np < 0), not in sparktrain's own folder.
        assert seen["cwd"] == str(tmp_path)
    assert _work_dirs() <= before


def test_script_exiting_non_zero_fails_the_run(tmp_path: Path) -> None:
    before = _work_dirs()
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=-2).run(str(SCRIPT), str(tmp_path), "0.1", "exit", "3")
    message = str(info.value)
    assert "rank 1" in message and "SystemExit: 3" in message
    assert _work_dirs() <= before


@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        (("0.01", 3), {}, "argument #1 of the script porting_train.py is a int (3)"),
        (("0.01",), {"lr": "0.01"}, "a script takes command-line arguments only"),
    ],
)
def test_script_arguments_must_be_strings(args: tuple, kwargs: dict, fragment: str) -> None:
    with pytest.raises(PayloadError) as info:
        SparkRunner(np=-2).run(str(SCRIPT), *args, **kwargs)
    assert fragment in str(info.value)


def test_missing_script_is_refused_naming_the_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PayloadError) as info:
        SparkRunner(np=-1).run("nope.py")
    assert "'nope.py', which is not found" in str(info.value) and str(tmp_path) in str(info.value)


def test_function_ranks_start_in_the_drivers_working_directory(tmp_path, monkeypatch) -> None:
    (tmp_path / "data.txt").write_text("shipped next to the job")
    monkeypatch.chdir(tmp_path)

    def read_relative() -> tuple[str, str]:
        with open("data.txt") as fh:
            return os.getcwd(), fh.read()

    assert SparkRunner(np=-1).run(read_relative) == (str(tmp_path), "shipped next to the job")


# -- the application's settings, checked before submitting (a stand-in session) -------------


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - SparkConf's name
        return list(self.values.items())


class _Context:
    """Only what the checks read: anything else (submitting a job) raises AttributeError."""

    def __init__(self, values: dict[str, str]) -> None:
        self._conf = _Conf(values)

    def getConf(self) -> _Conf:  # noqa: N802 - SparkContext's name
        return self._conf


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.sparkContext = _Context(values)


def _noop() -> None:
    return None


@pytest.mark.parametrize("amount", [None, "0"])
def test_use_gpu_without_gpus_for_tasks_is_refused(amount: str | None) -> None:
    conf = {} if amount is None else {"spark.task.resource.gpu.amount": amount}
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=2, use_gpu=True, spark=_Session(conf)).run(_noop)
    message = str(info.value)
    assert "use_gpu=True, but Spark gives this application's tasks no GPUs" in message
    for setting in (
        "spark.executor.resource.gpu.amount",
        "spark.task.resource.gpu.amount",
        "spark.executor.resource.gpu.discoveryScript",
    ):
        assert setting in message


@pytest.mark.parametrize("key", ["spark.ssl.enabled", "spark.network.crypto.enabled"])
def test_encrypted_application_is_refused_without_ignore_ssl(key: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=2, spark=_Session({key: "true"})).run(_noop)
    message = str(info.value)
    assert f"({key}=true)" in message and "is not encrypted" in message
    assert "ignore_ssl=True (spark.sparktrain.ignoreSsl true)" in message


@pytest.mark.parametrize(
    "settings, conf",
    [
        ({"ignore_ssl": True}, {"spark.ssl.enabled": "true"}),
        ({}, {"spark.ssl.enabled": "true", "spark.sparktrain.ignoreSsl": "true"}),
        ({"use_gpu": True}, {"spark.task.resource.gpu.amount": "1"}),
    ],
)
def test_checks_pass_when_the_application_allows_the_run(settings, conf) -> None:
    # The checks pass, so the run goes on to look at the cluster, which the stand-in lacks.
    with pytest.raises(AttributeError, match="has no attribute"):
        SparkRunner(np=2, spark=_Session(conf), **settings).run(_noop)
