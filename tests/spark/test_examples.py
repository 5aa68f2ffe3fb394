"""The tutorials in sparktrain.examples, each called in-process through its main(argv), with
tiny settings: on 2 Spark ranks (the session fixture's local-cluster) and on 2 driver ranks.

The examples' functions live in an installed module, so executors import them by name; the
tests only pass command lines and check what main() returns."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sparktrain.backends.horovod_install import horovod_torch_library
from sparktrain.checkpoint import load_latest

MODES = [
    pytest.param("local", id="local"),
    pytest.param("spark", id="spark", marks=pytest.mark.spark),
]

skip_without_horovod = pytest.mark.skipif(
    horovod_torch_library() is None,
    reason="horovod.torch is not importable (Horovod not installed, or built without "
    "PyTorch): build it with scripts/install-horovod.sh",
)


@pytest.fixture(params=MODES)
def np_flag(request) -> list[str]:
    """``--np`` for 2 ranks: on Spark executors (starting the session fixture) or locally."""
    if request.param == "spark":
        request.getfixturevalue("spark")
        return ["--np", "2"]
    return ["--np", "-2"]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails if ``path`` is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def falls(losses: list[float]) -> bool:
    return len(losses) >= 2 and losses[-1] < losses[0]


@pytest.mark.parametrize("np_flag", [MODES[1]], indirect=True)
def test_digits_main_job_reaches_95_percent_and_plots(np_flag, tmp_path, capsys):
    from sparktrain.examples import digits

    result = digits.main([*np_flag, "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert result["accuracy"] >= 0.95, result["epochs"]
    rows = result["epochs"]
    assert [r["epoch"] for r in rows] == list(range(1, digits.EPOCHS + 1))
    assert all(r["ranks"] == 2 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert "Data: scikit-learn's bundled handwritten digits" in out
    assert "Summary" in out and "time/epoch (s)" in out and "[rank 0] epoch 1:" in out
    plot = Path(result["plot"])
    assert plot.parent == tmp_path
    width, height = png_size(plot)
    assert width >= 600 and height >= 300
    assert 10_000 < plot.stat().st_size < 2_000_000
    ckpt = load_latest(result["checkpoint_dir"])
    assert ckpt is not None and ckpt.step == len(rows)
    assert len(ckpt.state["history"]) == len(rows)


def test_digits_resumes_on_the_driver(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the plot goes to ./sparktrain-out
    from sparktrain.examples import digits

    directory = str(tmp_path / "ckpt")
    first = digits.main(["--np", "-2", "--epochs", "1", "--checkpoint-dir", directory])
    assert first["checkpoint_dir"] == directory
    with pytest.raises(SystemExit):  # before any rank starts
        digits.main(["--np", "-2", "--resume", directory, "--checkpoint-dir", directory])
    assert "--resume names the checkpoint directory" in capsys.readouterr().err
    again = digits.main(
        [
            "--np",
            "-2",
            "--epochs",
            "2",
            "--out-dir",
            str(tmp_path),
            "--resume",
            first["checkpoint_dir"],
        ]
    )
    assert again["resumed_from"] == 1
    assert [r["epoch"] for r in again["epochs"]] == [1, 2]
    assert again["epochs"][:1] == first["epochs"]
    assert load_latest(first["checkpoint_dir"]).step == 2


def test_ddp_trainer(np_flag, tmp_path, capsys):
    from sparktrain.examples import ddp_trainer

    flags = [
        *np_flag,
        "--train-size",
        "256",
        "--test-size",
        "128",
        "--batch-size",
        "32",
        "--checkpoint-dir",
        str(tmp_path),
    ]
    result = ddp_trainer.main([*flags, "--epochs", "2"])
    out = capsys.readouterr().out
    assert falls(result["losses"]), result["losses"]
    assert "Data: generated CIFAR-10-shaped tensors" in out or "CIFAR-10 from" in out
    assert "Model: " in out and "Summary" in out
    assert load_latest(tmp_path).step == 2
    if "-2" in np_flag:  # a later run resumes from the snapshot (on the driver: quicker)
        again = ddp_trainer.main([*flags, "--epochs", "3"])
        assert "Resuming training from snapshot at epoch 2" in capsys.readouterr().out
        assert [r["epoch"] for r in again["epochs"]] == [1, 2, 3]
        assert again["epochs"][:2] == result["epochs"]
        assert load_latest(tmp_path).step == 3


def test_dist_torch_starter(np_flag, tmp_path):
    from sparktrain.examples import dist_torch_starter

    result = dist_torch_starter.main([*np_flag, "--epochs", "2", "--checkpoint-dir", str(tmp_path)])
    assert falls(result["losses"]), result["losses"]
    assert result["ranks"] == 2 and result["device"] == "cpu"
    assert load_latest(tmp_path).step == 2


def test_dist_torch_starter_gpus_flag_needs_gpus(monkeypatch):
    import torch

    from sparktrain.examples import dist_torch_starter

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit):
        dist_torch_starter.main(["--np", "-1", "--gpus"])


@pytest.mark.horovod
@skip_without_horovod
def test_mnist_horovod(np_flag, tmp_path, capsys):
    from sparktrain.examples import mnist_horovod

    # The single-node part runs in this process whatever --np says: once is enough.
    parts = ("single", "hvd") if "-2" in np_flag else ("hvd",)
    skip = [] if "single" in parts else ["--skip-single"]
    result = mnist_horovod.main(
        [*np_flag, "--epochs", "2", *skip, "--checkpoint-dir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert "Data: scikit-learn's bundled handwritten digits" in out
    assert "== HorovodRunner" in out
    assert ("== Single-node training ==" in out) == ("single" in parts)
    for part in parts:
        assert falls(result[part]["losses"]), (part, result[part]["losses"])
        assert load_latest(result[part]["log_dir"]).step == 2
        assert 0.0 <= result[part]["accuracy"] <= 1.0
    assert "[rank 0] epoch 2: mean train loss" in out  # log_to_driver passes the default filter
    # The summary says why the distributed row can look worse than the single process.
    assert ("Why the rows differ:" in out) == ("single" in parts)
    if "single" in parts:
        assert "of launch that the single process does not pay" in out
        assert "ranks ran on this machine's" in out and "1/2 of the data per epoch" in out


@pytest.mark.horovod
@skip_without_horovod
def test_torch_hvd_mnist(np_flag, tmp_path, capsys):
    from sparktrain.examples import torch_hvd_mnist

    # fp16 compression on the driver ranks, plain allreduce on Spark: both paths get run.
    fp16 = ["--fp16-allreduce"] if "-2" in np_flag else []
    result = torch_hvd_mnist.main(
        [*np_flag, "--epochs", "2", *fp16, "--checkpoint-dir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert falls(result["losses"]), result["losses"]
    assert result["settings"]["fp16_allreduce"] == bool(fp16)
    assert result["settings"]["lr"] == torch_hvd_mnist.DIGITS_LR
    assert all(r["seconds"] > 0 for r in result["epochs"])
    assert "time/epoch (s)" in out
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 2 and ckpt.state["epoch"] == 2


def test_plot_history_takes_lists_and_frames(tmp_path):
    from sparktrain.plot import history_frame, plot_history

    history = [
        {
            "type": "report",
            "rank": r,
            "step": None,
            "epoch": e,
            "metrics": {"loss": 1 / e + r, "accuracy": 0.5 + e / 20},
        }
        for e in (1, 2, 3)
        for r in (0, 1)
    ]
    frame = history_frame(history)
    assert list(frame.columns) == ["rank", "step", "epoch", "loss", "accuracy"]
    assert len(frame) == 6
    for source, name in ((history, "list.png"), (frame, "frame.png")):
        path = Path(plot_history(source, tmp_path / "sub" / name))
        assert png_size(path)[0] > 0
    with pytest.raises(ValueError, match="were not reported by rank 0"):
        plot_history(history, tmp_path / "x.png", metrics=["loss", "f1"])
    with pytest.raises(ValueError, match="no reports from rank 7"):
        plot_history(history, tmp_path / "x.png", rank=7)


@pytest.mark.spark
def test_digits_pipeline_example_fits_scores_and_reloads(spark, tmp_path):
    from sparktrain.examples import digits_pipeline

    result = digits_pipeline.main(["--np", "2", "--out-dir", str(tmp_path)])
    assert result["accuracy"] >= 0.95, result["history"]
    assert result["same_after_load"] is True
    assert (tmp_path / "digits-pipeline" / "stages").is_dir()


@pytest.mark.spark
def test_lightning_digits_on_executors_then_resumes_on_the_driver(spark, tmp_path, capsys):
    pytest.importorskip("lightning", reason="the frameworks extra is not installed")
    from sparktrain.examples import lightning_digits

    ckpt = str(tmp_path / "ckpt")
    result = lightning_digits.main(["--np", "2", "--epochs", "2", "--checkpoint-dir", ckpt])
    out = capsys.readouterr().out
    assert (result["world_size"], result["num_nodes"], result["devices"]) == (2, 1, 2)
    assert [r["epoch"] for r in result["history"]] == [1, 2] and result["resumed_from"] == 0
    assert falls([r["loss"] for r in result["history"]]), result["history"]
    assert "Lightning saw world size 2: 1 node(s) x 2 device(s)" in out and "Summary" in out
    # The same command with one more epoch continues from Lightning's last.ckpt.
    again = lightning_digits.main(["--np", "-2", "--epochs", "3", "--checkpoint-dir", ckpt])
    assert again["resumed_from"] == 2
    assert [r["epoch"] for r in again["history"]] == [3]


def test_hf_trainer_on_the_driver(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the frameworks extra is not installed")
    from sparktrain.examples import hf_trainer

    result = hf_trainer.main(["--np", "-2", "--epochs", "2", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert (result["world_size"], result["process_index"]) == (2, 0)
    assert falls(result["losses"]), result["losses"]
    assert result["steps"] == 2 * -(-(1797 - 360) // (2 * hf_trainer.BATCH_SIZE))
    assert "The Trainer saw world size 2" in out and "16-token sentences" in out
