"""The main job: a small CNN on the bundled handwritten digits, trained on 2 Spark ranks.

It starts an embedded Spark (``local-cluster[2,1,1024]``: two executor JVMs on this
machine) unless a SparkSession is already active, runs :func:`train` on two barrier tasks
with DistributedDataParallel, saves a checkpoint each epoch, reports loss and accuracy to the
driver, and prints a summary table and writes a training-curve PNG. No download: the digits
ship with scikit-learn.

Run it::

    python -m sparktrain.examples.digits                 # 2 ranks on Spark executors
    python -m sparktrain.examples.digits --np -2         # 2 ranks on this machine, no Spark
    python -m sparktrain.examples.digits --resume DIR --epochs 15   # continue a run
    python -m sparktrain.examples.digits --master spark://HOST:7077 --np 4 \
        --checkpoint-dir s3://bucket/digits    # on a cluster: checkpoints on shared storage
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sparktrain.examples import _common, _data

EPOCHS, LR, BATCH_SIZE = 12, 0.002, 32  # reaches >= 95% test accuracy by epoch 3-5


class DigitsNet(nn.Module):
    """Two 3x3 convolutions on the 8x8 digit, one pooling, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Dropout(0.25),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def train(
    epochs: int = EPOCHS,
    lr: float = LR,
    batch_size: int = BATCH_SIZE,
    checkpoint_dir: str | None = None,
    resume: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Train :class:`DigitsNet` on this rank's share of the digits; runs on every rank.

    Inside a run it joins the process group and wraps the model in DistributedDataParallel;
    outside one it trains alone, so it can be tried in a notebook cell first.

    Args:
        epochs: the epoch to stop after (counting resumed ones).
        lr: Adam's learning rate.
        batch_size: per-rank batch size.
        checkpoint_dir: where rank 0 saves a checkpoint after every epoch (None: no saves).
        resume: continue from the newest checkpoint in ``checkpoint_dir``.
        seed: seeds the model's initial weights and the shuffling.

    Returns:
        On every rank: ``history`` (one row per epoch: epoch, loss, accuracy, seconds,
        ranks), the final ``accuracy`` and ``loss``, ``ranks``, ``resumed_from`` (the
        epoch the run continued from, 0 for a fresh run) and the last ``checkpoint`` path.
    """
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Subset, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import sparktrain
    import sparktrain.checkpoint

    distributed = _common.init_distributed()
    rank, size = sparktrain.rank(), sparktrain.world_size()
    device = _common.rank_device()
    torch.manual_seed(seed)

    x_train, y_train, x_test, y_test = _data.digits_tensors()
    train_set = TensorDataset(x_train, y_train)
    sampler: DistributedSampler[Any] = DistributedSampler(
        train_set, num_replicas=size, rank=rank, seed=seed
    )
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    # Each rank scores every size-th test image, so together they score each exactly once.
    test_set = Subset(TensorDataset(x_test, y_test), range(rank, len(y_test), size))
    test_loader = DataLoader(test_set, batch_size=256)

    model = DigitsNet().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history: list[dict[str, Any]] = []
    start = 0
    if resume and checkpoint_dir:
        found = sparktrain.checkpoint.load_latest(checkpoint_dir, map_location="cpu")
        if found is not None:
            model.load_state_dict(found.state["model"])
            optimizer.load_state_dict(found.state["optimizer"])
            history = list(found.state["history"])
            start = found.step
            sparktrain.log_to_driver(f"resuming after epoch {start} from {found.path}")
    net = DistributedDataParallel(model) if distributed else model

    def total(*values: float) -> list[float]:
        """Sum ``values`` over the ranks."""
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        if distributed:
            dist.all_reduce(tensor)
        return tensor.tolist()

    def evaluate() -> tuple[float, float]:
        model.eval()
        loss_sum, correct = 0.0, 0.0
        with torch.no_grad():
            for xb, yb in test_loader:
                out = model(xb.to(device))
                loss_sum += float(F.cross_entropy(out, yb.to(device), reduction="sum"))
                correct += float((out.argmax(1).cpu() == yb).sum())
        loss_sum, correct, count = total(loss_sum, correct, float(len(test_set)))
        return loss_sum / count, correct / count

    saved = None
    for epoch in range(start + 1, epochs + 1):
        began = time.perf_counter()
        net.train()
        sampler.set_epoch(epoch)
        loss_sum, count = 0.0, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(xb.to(device)), yb.to(device))
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(yb)
            count += len(yb)
        loss_sum, seen = total(loss_sum, float(count))
        _, accuracy = evaluate()
        history.append(
            {
                "epoch": epoch,
                "loss": loss_sum / seen,
                "accuracy": accuracy,
                "seconds": time.perf_counter() - began,
                "ranks": size,
            }
        )
        row = history[-1]
        # Every rank may call save(); only rank 0 writes. After a resume this run takes
        # the directory over from the run that wrote it.
        if checkpoint_dir:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "history": history,
            }
            saved = (
                sparktrain.checkpoint.save(
                    state, checkpoint_dir, step=epoch, keep_last=3, take_over=resume
                )
                or saved
            )
        sparktrain.report(epoch=epoch, loss=row["loss"], accuracy=accuracy, seconds=row["seconds"])
        if rank == 0:
            print(
                f"epoch {epoch}: loss {row['loss']:.4f}  test accuracy {accuracy:.2%}  "
                f"({row['seconds']:.2f} s)",
                flush=True,
            )

    test_loss, accuracy = evaluate()
    if distributed:
        _common.shutdown_distributed()
    return {
        "history": history,
        "accuracy": accuracy,
        "loss": test_loss,
        "ranks": size,
        "resumed_from": start,
        "checkpoint": saved,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the job as the command line ``argv`` says; return its results.

    Returns:
        ``accuracy`` (test, after the last epoch), ``epochs`` (the per-epoch rows),
        ``seconds_per_epoch`` (mean), ``run_seconds`` (the runner's wall time),
        ``plot`` (the PNG's path, or None without matplotlib), ``checkpoint_dir``, ``data``
        and ``np``.
    """
    from sparktrain import SparkRunner

    parser = _common.make_parser(
        "digits",
        "A small CNN on scikit-learn's bundled digits, trained on Spark ranks with DDP.",
        epochs=EPOCHS,
        lr=LR,
        batch_size=BATCH_SIZE,
        data=False,
        checkpoints=False,
    )
    parser.add_argument(
        "--out-dir",
        default="sparktrain-out",
        help="where the plot and checkpoints go (default ./sparktrain-out)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default="",  # not None: _common.parse would fill that in under ./sparktrain-out
        help="where rank 0 saves a checkpoint each epoch: a local path or an fsspec URL "
        "(s3://, gs://, ...); on a cluster of several hosts it must be storage they share "
        "(default: a fresh directory under OUT_DIR/checkpoints)",
    )
    parser.add_argument(
        "--resume",
        metavar="CHECKPOINT_DIR",
        default=None,
        help="continue the run whose checkpoints are in CHECKPOINT_DIR",
    )
    args = _common.parse(parser, argv)
    _common.require(args, "sklearn")
    out = Path(args.out_dir)
    if args.resume and args.checkpoint_dir:
        parser.error("--resume names the checkpoint directory: leave out --checkpoint-dir")
    ckpt_dir = (
        args.resume or args.checkpoint_dir or _common.fresh_dir(out / "checkpoints", "digits")
    )
    data = (
        f"scikit-learn's bundled handwritten digits (1797 real 8x8 images; "
        f"{1797 - _data.DIGITS_TEST_SIZE} train / {_data.DIGITS_TEST_SIZE} test), "
        "no download"
    )
    print(f"Data: {data}", flush=True)
    print(
        f"Job: DigitsNet, {_common.where(args.np)}, {args.epochs} epochs, batch "
        f"{args.batch_size} per rank, Adam lr {args.lr}",
        flush=True,
    )

    with _common.spark_for(args.np, args.master) as spark:
        runner = SparkRunner(np=args.np, spark=spark)
        began = time.monotonic()
        result = runner.run(
            train,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            checkpoint_dir=ckpt_dir,
            resume=bool(args.resume),
        )
        run_seconds = time.monotonic() - began

    rows = result["history"]
    _common.print_table(rows, _common.EPOCH_COLUMNS, title="\nSummary")
    new = [r for r in rows if r["epoch"] > result["resumed_from"]]
    per_epoch = sum(r["seconds"] for r in new) / len(new) if new else 0.0
    plot = None
    try:
        from sparktrain.plot import plot_history

        # After a resume the runner saw only the new epochs; the checkpoint kept them all.
        curves = runner.history if not result["resumed_from"] else rows
        plot = plot_history(
            curves,
            out / "digits-history.png",
            metrics=["loss", "accuracy"],
            title=f"digits: {where_short(args.np)}",
        )
    except ImportError as exc:
        print(f"No plot: {exc}", flush=True)
    print(
        f"\nTest accuracy {result['accuracy']:.2%} after {len(rows)} epochs; "
        f"{per_epoch:.2f} s per epoch; the run took {run_seconds:.1f} s",
        flush=True,
    )
    if plot:
        print(f"Training curves: {os.path.abspath(plot)}")
    print(
        f"Checkpoints: {ckpt_dir} (continue with --resume {ckpt_dir} --epochs {args.epochs + 5})",
        flush=True,
    )
    return {
        "accuracy": result["accuracy"],
        "epochs": rows,
        "seconds_per_epoch": per_epoch,
        "run_seconds": run_seconds,
        "plot": plot,
        "checkpoint_dir": ckpt_dir,
        "checkpoint": result["checkpoint"],
        "data": data,
        "np": args.np,
        "resumed_from": result["resumed_from"],
    }


def where_short(np: int) -> str:
    """``"2 Spark ranks"`` or ``"2 local ranks"``."""
    return f"{abs(np)} {'Spark' if np > 0 else 'local'} ranks"


if __name__ == "__main__":
    # Call the module under its importable name, so that cloudpickle ships ``train`` to the
    # ranks by reference (``sparktrain.examples.digits.train``), not as ``__main__.train``.
    from sparktrain.examples import digits

    digits.main()
