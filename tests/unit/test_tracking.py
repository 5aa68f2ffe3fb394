"""MlflowTracker: rank 0's reports and the final checkpoint go to the driver's active run."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

from sparktrain.driver.tracking import MlflowTracker


def report(rank=0, step=None, epoch=None, **metrics):
    return {"type": "report", "rank": rank, "step": step, "epoch": epoch, "metrics": metrics}


def test_no_mlflow_means_no_tracker(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow → ImportError
    assert MlflowTracker.maybe_create() is None


def test_mlflow_is_not_imported_when_the_user_did_not(monkeypatch):
    monkeypatch.delitem(sys.modules, "mlflow", raising=False)
    assert MlflowTracker.maybe_create() is None
    assert "mlflow" not in sys.modules


@pytest.fixture
def mlflow(tmp_path, monkeypatch):
    """MLflow with a local file store under tmp_path (mlflow-skinny has no SQL backend)."""
    mlflow = pytest.importorskip("mlflow", reason="MLflow is optional: pip install mlflow-skinny")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses it otherwise
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)


def history(mlflow, run_id, key):
    client = mlflow.tracking.MlflowClient()
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def artifacts(mlflow, run_id, path="checkpoint"):
    client = mlflow.tracking.MlflowClient()
    return sorted(f.path for f in client.list_artifacts(run_id, path))


def fake_checkpoints(directory, steps):
    """A directory laid out as sparktrain.checkpoint.save leaves it (contents are dummies)."""
    directory.mkdir()
    (directory / "sparktrain-owner.json").write_text("{}")
    for step in steps:
        data = f"step-{step:012d}.{step:016x}.pt"
        (directory / data).write_bytes(b"weights %d" % step)
        marker = {"format": 1, "step": step, "data": data, "size": 9, "sha256": "0"}
        (directory / f"step-{step:012d}.commit.json").write_text(json.dumps(marker))
    (directory / "step-000000000099.0000000000000063.pt").write_bytes(b"uncommitted")
    return directory


def test_no_active_run_means_no_tracker(mlflow):
    assert MlflowTracker.maybe_create() is None


def test_logs_rank0_metrics_with_steps_and_final_checkpoint(mlflow, tmp_path):
    checkpoints = fake_checkpoints(tmp_path / "ckpt", [1, 2])
    with mlflow.start_run() as run:
        tracker = MlflowTracker.maybe_create()
        assert tracker is not None
        tracker.on_report(report(step=0, epoch=0, loss=1.0, acc=0.5))
        tracker.on_report(report(rank=1, step=0, epoch=0, loss=7.0))  # ignored
        tracker.on_report(report(step=10, epoch=1, loss=0.5, acc=0.75))
        tracker.on_report(report(loss=0.25))  # no step: the number of rank 0 reports before
        tracker.finish(str(checkpoints))
        tracker.finish(str(checkpoints))  # idempotent
    run_id = run.info.run_id
    assert history(mlflow, run_id, "loss") == [(0, 1.0), (10, 0.5), (2, 0.25)]
    assert history(mlflow, run_id, "acc") == [(0, 0.5), (10, 0.75)]
    assert history(mlflow, run_id, "epoch") == [(0, 0.0), (10, 1.0)]
    # Only the newest committed checkpoint: its data and its commit marker.
    assert artifacts(mlflow, run_id) == [
        "checkpoint/step-000000000002.0000000000000002.pt",
        "checkpoint/step-000000000002.commit.json",
    ]
    tag = mlflow.tracking.MlflowClient().get_run(run_id).data.tags["sparktrain.checkpoint"]
    assert tag.endswith("step-000000000002.0000000000000002.pt")


def test_metrics_are_batched_until_finish(mlflow):
    with mlflow.start_run() as run:
        tracker = MlflowTracker.maybe_create()
        tracker.flush_interval = 3600
        for step in range(5):
            tracker.on_report(report(step=step, loss=1.0 / (step + 1)))
        assert history(mlflow, run.info.run_id, "loss") == []  # still buffered
        tracker.finish(None)
    assert [s for s, _ in history(mlflow, run.info.run_id, "loss")] == [0, 1, 2, 3, 4]


def test_plain_directory_or_file_is_logged_whole(mlflow, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w")
    (folder / "config.json").write_text("{}")
    with mlflow.start_run() as run:
        MlflowTracker.maybe_create().finish(str(folder))
    assert artifacts(mlflow, run.info.run_id) == [
        "checkpoint/config.json",
        "checkpoint/weights.bin",
    ]
    with mlflow.start_run() as run:
        MlflowTracker.maybe_create().finish((folder / "weights.bin").as_uri())
    assert artifacts(mlflow, run.info.run_id) == ["checkpoint/weights.bin"]


def test_errors_become_one_warning(mlflow, tmp_path):
    class BrokenClient:
        calls = 0

        def log_batch(self, *args, **kwargs):
            BrokenClient.calls += 1
            raise ConnectionError("tracking server unreachable")

    tracker = MlflowTracker(BrokenClient(), "run-id", flush_every=1)
    with pytest.warns(RuntimeWarning, match="MLflow tracking failed.*unreachable") as caught:
        for step in range(3):
            tracker.on_report(report(step=step, loss=1.0))
        tracker.finish(str(tmp_path))
    assert len(caught) == 1 and BrokenClient.calls == 1


def test_missing_checkpoint_path_is_a_warning_not_an_error(mlflow, tmp_path):
    with mlflow.start_run() as run:
        tracker = MlflowTracker.maybe_create()
        tracker.on_report(report(step=0, loss=1.0))
        with pytest.warns(RuntimeWarning, match="does not exist"):
            tracker.finish(str(tmp_path / "nowhere"))
    assert history(mlflow, run.info.run_id, "loss") == [(0, 1.0)]  # metrics still went out


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_a_sharded_checkpoint_is_logged_as_its_folder_of_shards(mlflow, tmp_path, scheme):
    torch = pytest.importorskip("torch")
    from sparktrain import checkpoint

    where = str(tmp_path / "ckpt") if scheme == "local" else f"memory://tracked-{uuid.uuid4().hex}"
    checkpoint.save({"w": torch.ones(3)}, where, 1, sharded=True)
    newest = checkpoint.save({"w": torch.zeros(3)}, where, 2, sharded=True)
    assert newest is not None
    folder = newest.rstrip("/").rsplit("/", 1)[-1]
    with mlflow.start_run() as run:
        MlflowTracker.maybe_create().finish(where)
    logged = artifacts(mlflow, run.info.run_id)
    assert logged == sorted([f"checkpoint/{folder}", "checkpoint/step-000000000002.commit.json"])
    shards = artifacts(mlflow, run.info.run_id, f"checkpoint/{folder}")
    assert f"checkpoint/{folder}/.metadata" in shards and len(shards) >= 2
