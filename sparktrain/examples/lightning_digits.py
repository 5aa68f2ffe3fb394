"""Lightning's ``Trainer``, unchanged, on Spark ranks: a small network on the bundled digits.

The function each rank runs is ordinary Lightning code: a ``LightningModule`` and
``Trainer(strategy="ddp")``. The only sparktrain part is where ``devices`` and ``num_nodes``
come from: the ranks on this node and the number of nodes, so the same line fits any layout.
Lightning saves a checkpoint each epoch; run again with the same ``--checkpoint-dir`` and
``ckpt_path="last"`` continues from it. No download: the digits ship with scikit-learn.

Run it::

    python -m sparktrain.examples.lightning_digits               # 2 ranks on Spark executors
    python -m sparktrain.examples.lightning_digits --np -2       # 2 ranks here, no Spark
    python -m sparktrain.examples.lightning_digits --checkpoint-dir DIR --epochs 8  # continue

Needs ``pip install 'sparktrain[frameworks,examples]'`` (Lightning, scikit-learn).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sparktrain.examples import _common, _data

EPOCHS, LR, BATCH_SIZE = 4, 0.003, 32


def train(epochs: int, lr: float, batch_size: int, checkpoint_dir: str) -> dict[str, Any]:
    """Fit a two-layer network with Lightning on this rank's share of the digits.

    Args:
        epochs: the epoch to stop after (counting those a checkpoint already holds).
        lr: Adam's learning rate.
        batch_size: per-rank batch size.
        checkpoint_dir: where Lightning saves ``last.ckpt`` each epoch, and resumes from.

    Returns:
        ``history`` (epoch, train loss, test accuracy per epoch this run trained), the final
        ``accuracy``, ``resumed_from`` (the epoch the run continued from) and what Lightning
        saw: ``world_size``, ``num_nodes``, ``devices``.
    """
    import lightning as L
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import ModelCheckpoint

    import sparktrain

    x_train, y_train, x_test, y_test = _data.digits_tensors()
    history: list[dict[str, Any]] = []

    class DigitsMLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Flatten(),
                torch.nn.Linear(64, 128),
                torch.nn.ReLU(),
                torch.nn.Linear(128, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def on_train_epoch_end(self) -> None:
            with torch.no_grad():  # every rank holds the whole model: score the test set here
                accuracy = float((self(x_test).argmax(1) == y_test).float().mean())
            loss = float(self.trainer.callback_metrics["train_loss"])
            history.append({"epoch": self.current_epoch + 1, "loss": loss, "accuracy": accuracy})
            if self.global_rank == 0:
                print(
                    f"epoch {self.current_epoch + 1}: loss {loss:.4f}  test accuracy {accuracy:.2%}"
                )

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=lr)

    torch.manual_seed(0)
    # Lightning's view of the layout is the layout: the ranks on this node, and the nodes.
    devices = sparktrain.local_world_size()
    num_nodes = sparktrain.world_size() // devices
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy="ddp",
        max_epochs=epochs,
        logger=False,
        callbacks=[ModelCheckpoint(dirpath=checkpoint_dir, save_last=True)],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=checkpoint_dir,
    )
    model = DigitsMLP()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True
    )
    began = time.perf_counter()
    trainer.fit(model, loader, ckpt_path="last")  # "last": none yet starts afresh
    resumed_from = epochs - len(history)
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    return {
        "history": history,
        "accuracy": accuracy,
        "resumed_from": resumed_from,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "devices": devices,
        "seconds": time.perf_counter() - began,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run :func:`train` on ``--np`` ranks as the command line ``argv`` says; return its result."""
    from sparktrain import SparkRunner

    parser = _common.make_parser(
        "lightning_digits",
        "Lightning's Trainer on Spark ranks: a small network on scikit-learn's bundled digits.",
        epochs=EPOCHS,
        lr=LR,
        batch_size=BATCH_SIZE,
        data=False,
    )
    args = _common.parse(parser, argv)
    _common.require(args, "lightning", "sklearn")
    print(
        "Data: scikit-learn's bundled handwritten digits "
        f"({1797 - _data.DIGITS_TEST_SIZE} train / {_data.DIGITS_TEST_SIZE} test), no download",
        flush=True,
    )
    print(f"Job: Lightning Trainer(strategy='ddp'), {_common.where(args.np)}", flush=True)
    with _common.spark_for(args.np, args.master) as spark:
        runner = SparkRunner(np=args.np, spark=spark)
        result = runner.run(train, args.epochs, args.lr, args.batch_size, args.checkpoint_dir)
    rows = [{**row, "ranks": result["world_size"]} for row in result["history"]]
    _common.print_table(
        rows, [c for c in _common.EPOCH_COLUMNS if c[0] != "seconds"], title="\nSummary"
    )
    print(
        f"Lightning saw world size {result['world_size']}: {result['num_nodes']} node(s) x "
        f"{result['devices']} device(s); test accuracy {result['accuracy']:.2%}; "
        f"checkpoints in {args.checkpoint_dir}",
        flush=True,
    )
    return {**result, "np": args.np, "checkpoint_dir": args.checkpoint_dir}


if __name__ == "__main__":
    # Run under the importable name, so cloudpickle ships train by reference.
    from sparktrain.examples import lightning_digits

    lightning_digits.main()
