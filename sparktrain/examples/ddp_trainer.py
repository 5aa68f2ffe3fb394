"""The PyTorch DDP tutorial's ``Trainer``, run on Spark ranks by ``SparkRunner``.

The tutorial's shape is kept: ``load_train_objs`` builds the data set, model and optimizer;
``prepare_dataloader`` puts a ``DistributedSampler`` behind the ``DataLoader``; the
``Trainer`` wraps the model in ``DistributedDataParallel``, runs batches and epochs, and
saves a snapshot from rank 0 every ``save_every`` epochs, which a restarted run resumes from
(the tutorial's torchrun version). What ``torchrun`` / ``mp.spawn`` did is
``SparkRunner(np=...).run(main_worker, ...)``: the process group needs no arguments.

The model is torchvision's ResNet-18 when torchvision is importable, else a small ResNet
written here; the data is CIFAR-10 from ``--data-dir`` when present, else generated
CIFAR-shaped tensors with learnable class structure.

Run it::

    python -m sparktrain.examples.ddp_trainer                   # 2 Spark ranks
    python -m sparktrain.examples.ddp_trainer --np -2 --epochs 2 --train-size 512
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from sparktrain.examples import _common, _data


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (He et al., 2016)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet for 32x32 images: a stem, three stages of one block each, a linear head."""

    def __init__(self, num_classes: int = 10, widths: Sequence[int] = (16, 32, 64)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks, cin = [], widths[0]
        for i, width in enumerate(widths):
            blocks.append(BasicBlock(cin, width, stride=1 if i == 0 else 2))
            cin = width
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def model_choice() -> tuple[str, str]:
    """``("resnet18", why)`` when torchvision is importable, else ``("small", why)``."""
    torchvision, why = _data.torchvision_or_reason()
    if torchvision is None:
        return "small", f"a small ResNet (3 stages of 16/32/64 channels), since {why}"
    return "resnet18", "torchvision's ResNet-18 (10 classes)"


def build_model(kind: str) -> nn.Module:
    """The model called ``kind`` by :func:`model_choice`."""
    if kind == "resnet18":
        from torchvision.models import resnet18

        model: nn.Module = resnet18(num_classes=10)
        return model
    return SmallResNet()


def load_train_objs(
    data: str, data_dir: str | None, model: str, lr: float, train_size: int, test_size: int
) -> tuple[Dataset[Any], Dataset[Any], nn.Module, torch.optim.Optimizer]:
    """The tutorial's ``load_train_objs``: train set, test set, model, optimizer."""
    train_set, test_set = _data.load_cifar_like(data, data_dir, train_size, test_size)
    net = build_model(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    return train_set, test_set, net, optimizer


def prepare_dataloader(dataset: Dataset[Any], batch_size: int, shuffle: bool = True) -> DataLoader:
    """A DataLoader that gives each rank its own share of ``dataset``."""
    from torch.utils.data.distributed import DistributedSampler

    import sparktrain

    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=sparktrain.world_size(), rank=sparktrain.rank(), shuffle=shuffle
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        sampler=sampler,
        pin_memory=torch.cuda.is_available(),
    )


class Trainer:
    """The tutorial's Trainer: DDP model, per-batch step, per-epoch loop, rank-0 snapshots."""

    def __init__(
        self,
        model: nn.Module,
        train_data: DataLoader,
        test_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_dir: str | None,
    ) -> None:
        import sparktrain

        self.rank = sparktrain.rank()
        self.device = _common.rank_device()
        self.model = model.to(self.device)
        self.train_data = train_data
        self.test_data = test_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_dir = snapshot_dir
        self.epochs_run = 0
        self.history: list[dict[str, Any]] = []
        if snapshot_dir:
            self._load_snapshot(snapshot_dir)
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DDP(self.model, device_ids=device_ids)

    def _load_snapshot(self, snapshot_dir: str) -> None:
        import sparktrain
        import sparktrain.checkpoint

        found = sparktrain.checkpoint.load_latest(snapshot_dir, map_location=self.device)
        if found is None:
            return
        self.model.load_state_dict(found.state["model"])
        self.optimizer.load_state_dict(found.state["optimizer"])
        self.history = list(found.state["history"])
        self.epochs_run = found.step
        sparktrain.log_to_driver(f"Resuming training from snapshot at epoch {self.epochs_run}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        output = self.ddp(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> float:
        b_sz = self.train_data.batch_size
        print(
            f"[{self.device}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}",
            flush=True,
        )
        self.train_data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        self.ddp.train()
        total, seen = 0.0, 0
        for source, targets in self.train_data:
            source, targets = source.to(self.device), targets.to(self.device)
            total += self._run_batch(source, targets) * len(targets)
            seen += len(targets)
        return self._mean(total, seen)

    def _mean(self, total: float, count: float) -> float:
        """``sum(total) / sum(count)`` over the ranks."""
        import torch.distributed as dist

        both = torch.tensor([total, float(count)], dtype=torch.float64, device=self.device)
        dist.all_reduce(both)
        return float(both[0] / both[1])

    def evaluate(self) -> float:
        """Accuracy on the test set, agreed over the ranks."""
        self.model.eval()
        correct, seen = 0.0, 0
        with torch.no_grad():
            for source, targets in self.test_data:
                output = self.model(source.to(self.device))
                correct += float((output.argmax(1).cpu() == targets).sum())
                seen += len(targets)
        return self._mean(correct, seen)

    def _save_snapshot(self, epoch: int, snapshot_dir: str) -> None:
        import sparktrain.checkpoint

        snapshot = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "history": self.history,
        }
        # take_over: a resumed run continues the snapshots of the run it resumes.
        path = sparktrain.checkpoint.save(
            snapshot, snapshot_dir, step=epoch, keep_last=2, take_over=True
        )
        print(f"Epoch {epoch} | Training snapshot saved at {path}", flush=True)

    def train(self, max_epochs: int) -> list[dict[str, Any]]:
        """Train from the epoch after the snapshot up to ``max_epochs``; return per-epoch rows."""
        import sparktrain

        for epoch in range(self.epochs_run + 1, max_epochs + 1):
            began = time.perf_counter()
            loss = self._run_epoch(epoch)
            accuracy = self.evaluate()
            row = {
                "epoch": epoch,
                "loss": loss,
                "accuracy": accuracy,
                "seconds": time.perf_counter() - began,
            }
            self.history.append(row)
            sparktrain.report(epoch=epoch, loss=loss, accuracy=accuracy)
            if self.rank == 0:
                sparktrain.log_to_driver(
                    f"epoch {epoch}: loss {loss:.4f}, test accuracy "
                    f"{accuracy:.2%}, {row['seconds']:.2f} s"
                )
            if self.rank == 0 and self.snapshot_dir and epoch % self.save_every == 0:
                self._save_snapshot(epoch, self.snapshot_dir)
        return self.history


def main_worker(
    total_epochs: int,
    batch_size: int,
    lr: float,
    data: str,
    data_dir: str | None,
    model: str,
    train_size: int,
    test_size: int,
    save_every: int = 1,
    snapshot_dir: str | None = None,
) -> dict[str, Any]:
    """The tutorial's ``main``, on every rank: set up, train, tear down.

    Returns:
        ``history`` (rows of epoch, loss, accuracy, seconds) and ``ranks``.
    """
    import torch.distributed as dist

    import sparktrain

    dist.init_process_group(sparktrain.default_backend())
    torch.manual_seed(0)
    train_set, test_set, net, optimizer = load_train_objs(
        data, data_dir, model, lr, train_size, test_size
    )
    trainer = Trainer(
        net,
        prepare_dataloader(train_set, batch_size),
        prepare_dataloader(test_set, 256, shuffle=False),
        optimizer,
        save_every,
        snapshot_dir,
    )
    history = trainer.train(total_epochs)
    ranks = dist.get_world_size()
    del trainer  # DDP's reducer goes before its process group
    _common.shutdown_distributed()
    return {"history": history, "ranks": ranks}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the tutorial on ``--np`` ranks; return its results.

    Returns:
        ``epochs`` (rows), ``losses``, ``accuracy`` (last epoch), ``seconds_per_epoch``,
        ``run_seconds``, ``model``, ``data``, ``np`` and ``checkpoint_dir``.
    """
    from sparktrain import SparkRunner

    parser = _common.make_parser(
        "ddp_trainer",
        "The PyTorch DDP tutorial's Trainer on CIFAR-10-shaped data.",
        epochs=3,
        batch_size=32,
        lr=0.02,
    )
    parser.add_argument(
        "--save-every", type=int, default=1, help="snapshot every N epochs (default 1)"
    )
    parser.add_argument(
        "--train-size",
        type=int,
        default=2048,
        help="generated training images, when CIFAR-10 is absent (default 2048)",
    )
    parser.add_argument(
        "--test-size",
        type=int,
        default=512,
        help="generated test images, when CIFAR-10 is absent (default 512)",
    )
    args = _common.parse(parser, argv)
    _common.require(args)
    data = _data.cifar_choice(args.data_dir, args.train_size, args.test_size)
    model, model_text = model_choice()
    print(f"Data: {data.description}", flush=True)
    print(f"Model: {model_text}", flush=True)
    print(
        f"Settings: {_common.where(args.np)}, {args.epochs} epochs, batch {args.batch_size} "
        f"per rank, SGD lr {args.lr}; snapshots in {args.checkpoint_dir}",
        flush=True,
    )
    with _common.spark_for(args.np, args.master) as spark:
        runner = SparkRunner(np=args.np, spark=spark, driver_log_verbosity="log_callback_only")
        began = time.monotonic()
        result = runner.run(
            main_worker,
            args.epochs,
            args.batch_size,
            args.lr,
            data.kind,
            args.data_dir,
            model,
            args.train_size,
            args.test_size,
            save_every=args.save_every,
            snapshot_dir=args.checkpoint_dir,
        )
        run_seconds = time.monotonic() - began
    rows = result["history"]
    _common.print_table(
        [{**r, "ranks": result["ranks"]} for r in rows], _common.EPOCH_COLUMNS, title="\nSummary"
    )
    print(f"The run took {run_seconds:.1f} s", flush=True)
    return {
        "epochs": rows,
        "losses": [r["loss"] for r in rows],
        "accuracy": rows[-1]["accuracy"] if rows else None,
        "seconds_per_epoch": sum(r["seconds"] for r in rows) / max(len(rows), 1),
        "run_seconds": run_seconds,
        "model": model_text,
        "data": data.description,
        "np": args.np,
        "checkpoint_dir": args.checkpoint_dir,
    }


if __name__ == "__main__":
    # Run under the importable name, so cloudpickle ships main_worker by reference.
    from sparktrain.examples import ddp_trainer

    ddp_trainer.main()
