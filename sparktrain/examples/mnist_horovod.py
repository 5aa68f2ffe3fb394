"""Databricks' "PyTorch MNIST with HorovodRunner" notebook, on any Spark.

The notebook's story, in order:

1. single-node training: ``train(learning_rate)`` on this machine, a checkpoint per epoch,
   then ``test(log_dir)`` from the last checkpoint;
2. the same loop made distributed: ``train_hvd(learning_rate)`` with ``hvd.init()``, a
   ``DistributedSampler`` over ``hvd.size()`` ranks, the learning rate scaled by
   ``hvd.size()``, ``hvd.DistributedOptimizer`` and ``hvd.broadcast_parameters``, checkpoints
   from rank 0 only, run through ``HorovodRunner(np=2)``; then ``test(hvd_log_dir)``.

The only change from Databricks is the import: ``from sparktrain import HorovodRunner``
instead of ``from sparkdl import HorovodRunner``. The notebook's settings that the command
line can change (data, ``num_epochs``, ``batch_size``) travel as one :class:`Settings`
argument to ``train``, ``train_hvd`` and ``test``, because executors import this module
afresh and would not see values set on the driver.

:class:`Net` and :func:`train_one_epoch` also serve ``torch_hvd_mnist`` (the Horovod
workshop's script uses the same network and training step).

Run it::

    python -m sparktrain.examples.mnist_horovod                  # HorovodRunner(np=2) on Spark
    python -m sparktrain.examples.mnist_horovod --np -2          # 2 ranks here, no Spark
    python -m sparktrain.examples.mnist_horovod --data-dir ~/data   # torchvision's MNIST
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sparktrain.examples import _common, _data

# The notebook's settings.
batch_size = 100
num_epochs = 3
momentum = 0.5
log_interval = 100
NOTEBOOK_LR = 0.001  # tuned for MNIST's 60000 images: 600 steps an epoch
DIGITS_LR = 0.05  # the 1437 digits give 15 steps an epoch; a larger rate makes up for it


@dataclass(frozen=True)
class Settings:
    """The settings ``train``, ``train_hvd`` and ``test`` share, chosen on the driver.

    Attributes:
        data: ``"mnist"`` or ``"digits"`` (see :func:`sparktrain.examples._data.mnist_choice`).
        data_dir: torchvision's data root, for ``"mnist"``.
        epochs: the notebook's ``num_epochs``.
        batch: the notebook's ``batch_size``.
    """

    data: str = "digits"
    data_dir: str | None = None
    epochs: int = num_epochs
    batch: int = batch_size


class Net(nn.Module):
    """The notebook's LeNet-style network for 1x28x28 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train_one_epoch(
    model: nn.Module,
    device: torch.device,
    data_loader: Any,
    optimizer: Any,
    epoch: int,
    log_interval: int = log_interval,
) -> float:
    """One pass over ``data_loader``; prints progress every ``log_interval`` batches.

    The progress line counts this rank's samples (``len(data_loader.sampler)``), as the
    Horovod workshop's script does; the notebook printed batches times batch size.

    Returns:
        The mean training loss of the epoch on this rank.
    """
    model.train()
    total, seen = 0.0, 0
    for batch_idx, (data, target) in enumerate(data_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(data)
        seen += len(data)
        if batch_idx % log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(data_loader.sampler)} "
                f"({100.0 * batch_idx / len(data_loader):.0f}%)]\tLoss: {loss.item():.6f}",
                flush=True,
            )
    return total / max(seen, 1)


def save_checkpoint(log_dir: str, model: nn.Module, optimizer: Any, epoch: int) -> None:
    """The notebook's ``save_checkpoint``, committed atomically by sparktrain.checkpoint.

    Only rank 0 writes (outside a run the process is rank 0).
    """
    import sparktrain.checkpoint

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    sparktrain.checkpoint.save(state, log_dir, step=epoch)


def load_checkpoint(log_dir: str) -> dict[str, Any]:
    """The newest checkpoint's state in ``log_dir``."""
    import sparktrain.checkpoint

    found = sparktrain.checkpoint.load_latest(log_dir, map_location="cpu")
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {log_dir}")
    state: dict[str, Any] = found.state
    return state


def train(learning_rate: float, log_dir: str, settings: Settings = Settings()) -> list[float]:
    """Single-node training, as in the notebook's first part.

    Returns:
        The mean training loss of each epoch.
    """
    s = settings
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_dataset, _ = _data.load_mnist_like(s.data, s.data_dir)
    data_loader = torch.utils.data.DataLoader(train_dataset, batch_size=s.batch, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    losses = []
    for epoch in range(1, s.epochs + 1):
        losses.append(train_one_epoch(model, device, data_loader, optimizer, epoch))
        save_checkpoint(log_dir, model, optimizer, epoch)
    return losses


def test(log_dir: str, settings: Settings = Settings()) -> dict[str, float]:
    """Load the newest checkpoint of ``log_dir`` and score it on the test set.

    Returns:
        ``test_loss`` (mean negative log-likelihood) and ``accuracy``.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loaded_model = Net().to(device)
    checkpoint = load_checkpoint(log_dir)
    loaded_model.load_state_dict(checkpoint["model"])
    loaded_model.eval()
    _, test_dataset = _data.load_mnist_like(settings.data, settings.data_dir)
    data_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000)
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data_, target in data_loader:
            data_, target = data_.to(device), target.to(device)
            output = loaded_model(data_)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(dim=1) == target).sum())
    count = len(data_loader.dataset)  # type: ignore[arg-type]
    print(f"Average test loss: {test_loss / count:.4f}, accuracy {correct / count:.2%}", flush=True)
    return {"test_loss": test_loss / count, "accuracy": correct / count}


def train_hvd(learning_rate: float, log_dir: str, settings: Settings = Settings()) -> list[float]:
    """The notebook's ``train_hvd``: the same loop on every Horovod rank.

    Returns:
        The mean training loss of each epoch, averaged over the ranks.
    """
    import horovod.torch as hvd
    from torch.utils.data.distributed import DistributedSampler

    import sparktrain

    s = settings
    hvd.init()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        # Pin each GPU to a single process.
        torch.cuda.set_device(hvd.local_rank())

    train_dataset, _ = _data.load_mnist_like(s.data, s.data_dir)
    # Configure the sampler so that each worker gets a distinct sample of the input dataset.
    train_sampler: DistributedSampler[Any] = DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    # Use train_sampler to load a different sample of data on each worker.
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=s.batch, sampler=train_sampler
    )

    model = Net().to(device)
    # The effective batch size in synchronous distributed training is scaled by the number of
    # workers; an increase in learning rate compensates for the increased batch size.
    optimizer = torch.optim.SGD(
        model.parameters(), lr=learning_rate * hvd.size(), momentum=momentum
    )
    # Wrap the local optimizer with hvd.DistributedOptimizer so that Horovod handles the
    # distributed optimization.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # Broadcast initial parameters so all workers start with the same parameters.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    losses = []
    for epoch in range(1, s.epochs + 1):
        train_sampler.set_epoch(epoch)
        local = train_one_epoch(model, device, train_loader, optimizer, epoch)
        loss = float(hvd.allreduce(torch.tensor(local), name="epoch_loss"))
        losses.append(loss)
        sparktrain.report(epoch=epoch, loss=loss)
        # Save checkpoints only on worker 0 to prevent conflicts between workers.
        if hvd.rank() == 0:
            save_checkpoint(log_dir, model, optimizer, epoch)
            sparktrain.log_to_driver(f"epoch {epoch}: mean train loss {loss:.4f}")
    return losses


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the notebook: single-node ``train`` + ``test``, then ``train_hvd`` + ``test``.

    Returns:
        ``single`` and ``hvd``, each with ``losses`` (per epoch), ``test_loss``,
        ``accuracy``, ``seconds`` and ``log_dir`` (``single`` is None with
        ``--skip-single``); plus ``data``, ``np`` and ``learning_rate``.
    """
    from sparktrain import HorovodRunner

    parser = _common.make_parser(
        "mnist_horovod",
        "Databricks' HorovodRunner MNIST notebook: single-node, then HorovodRunner.",
        epochs=num_epochs,
        batch_size=batch_size,
        lr=None,
        lr_help=f"{NOTEBOOK_LR} for MNIST as in the notebook, {DIGITS_LR} for the digits",
    )
    parser.add_argument(
        "--skip-single",
        action="store_true",
        help="skip the single-node part and go straight to HorovodRunner",
    )
    args = _common.parse(parser, argv)
    choice = _data.mnist_choice(args.data_dir)
    _common.require(args, *(["sklearn"] if choice.kind == "digits" else []))
    lr = args.lr if args.lr is not None else (NOTEBOOK_LR if choice.kind == "mnist" else DIGITS_LR)
    print(f"Data: {choice.description}", flush=True)
    print(
        f"Settings: {args.epochs} epochs, batch {args.batch_size}, learning rate {lr}"
        f"{'' if args.lr is not None or choice.kind == 'mnist' else ' (digits default)'},"
        f" momentum {momentum}; checkpoints under {args.checkpoint_dir}",
        flush=True,
    )
    settings = Settings(choice.kind, args.data_dir, args.epochs, args.batch_size)
    results: dict[str, Any] = {
        "data": choice.description,
        "np": args.np,
        "learning_rate": lr,
        "single": None,
    }

    if not args.skip_single:
        print("\n== Single-node training ==", flush=True)
        log_dir = f"{args.checkpoint_dir}/single"
        began = time.monotonic()
        losses = train(lr, log_dir, settings)
        seconds = time.monotonic() - began
        results["single"] = {
            "losses": losses,
            "seconds": seconds,
            "log_dir": log_dir,
            **test(log_dir, settings),
        }

    print(f"\n== HorovodRunner: {_common.where(args.np)} ==", flush=True)
    hvd_log_dir = f"{args.checkpoint_dir}/hvd"
    with _common.spark_for(args.np, args.master) as spark:
        hr = HorovodRunner(np=args.np, spark=spark)
        began = time.monotonic()
        losses = hr.run(train_hvd, learning_rate=lr, log_dir=hvd_log_dir, settings=settings)
        seconds = time.monotonic() - began
    results["hvd"] = {
        "losses": losses,
        "seconds": seconds,
        "log_dir": hvd_log_dir,
        **test(hvd_log_dir, settings),
    }

    rows = [
        {
            "run": name,
            "ranks": 1 if name == "single" else abs(args.np),
            **r,
            "first": r["losses"][0],
            "last": r["losses"][-1],
        }
        for name in ("single", "hvd")
        if (r := results[name]) is not None
    ]
    _common.print_table(
        rows,
        [
            ("run", "run", ""),
            ("ranks", "ranks", "d"),
            ("first", "loss, epoch 1", ".4f"),
            ("last", f"loss, epoch {args.epochs}", ".4f"),
            ("accuracy", "test accuracy", ".2%"),
            ("seconds", "wall (s)", ".1f"),
        ],
        title="\nSummary",
    )
    if results["single"] is not None:
        local = args.np < 0 or str(args.master).startswith("local")
        print(_why_they_differ(results, hr.last_run, abs(args.np), local), flush=True)
    return results


def _why_they_differ(results: dict[str, Any], record: Any, ranks: int, local: bool) -> str:
    """Why the distributed row can look worse than the single process on a small machine.

    Args:
        results: ``main``'s results, both runs in.
        record: the HorovodRunner run's record (``hr.last_run``).
        ranks: how many ranks trained.
        local: whether the ranks ran on this machine (np < 0, or a local master).
    """
    hvd = results["hvd"]
    attempt = record.attempts[-1] if record is not None and record.attempts else None
    function = attempt.breakdown.get("function") if attempt is not None else None
    lines = ["Why the rows differ:"]
    if function is not None:
        launch = max(0.0, hvd["seconds"] - function)
        lines.append(
            f"- HorovodRunner's {hvd['seconds']:.1f}s of wall time include {launch:.1f}s of "
            "launch that the single process does not pay (the job, a Python per rank that "
            f"imports torch, the rendezvous); train_hvd itself ran {function:.1f}s on rank 0 "
            "(hr.last_run.describe() has every phase)."
        )
    if local:
        lines.append(
            f"- Its {ranks} ranks ran on this machine's {os.cpu_count()} CPU cores, which the "
            "single process had to itself: more ranks pay off with a core or GPU each."
        )
    lines.append(
        f"- Each rank trains on 1/{ranks} of the data per epoch (DistributedSampler), so an "
        f"epoch is {ranks}x fewer optimizer steps, with the learning rate scaled by "
        "hvd.size() as in the notebook: losses per epoch are not step for step alike."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    # Run under the importable name, so cloudpickle ships train_hvd to the ranks by reference.
    from sparktrain.examples import mnist_horovod

    mnist_horovod.main()
