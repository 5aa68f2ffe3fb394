"""The Horovod workshop's PyTorch MNIST script, run through ``HorovodRunner``.

What the workshop teaches, all here: the learning rate scaled by ``hvd.size()``,
``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` so every rank starts
alike, ``hvd.DistributedOptimizer`` with ``--fp16-allreduce`` (``hvd.Compression.fp16``),
``metric_average`` (``hvd.allreduce``) to agree on test loss and accuracy, checkpoints written
by rank 0 only, and the time of each epoch. ``horovodrun -np 2 python pytorch_mnist.py``
becomes ``python -m sparktrain.examples.torch_hvd_mnist --np 2``.

The script's ``Net`` and the body of its ``train(epoch)`` are the same as those of
Databricks' notebook, so they are imported from ``mnist_horovod`` (:class:`Net`,
:func:`train_one_epoch`); the rest is the workshop's.

Run it::

    python -m sparktrain.examples.torch_hvd_mnist                      # 2 Spark ranks
    python -m sparktrain.examples.torch_hvd_mnist --np -2 --fp16-allreduce
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from sparktrain.examples import _common, _data
from sparktrain.examples.mnist_horovod import Net, train_one_epoch

WORKSHOP_LR = 0.01  # for MNIST's 60000 images
DIGITS_LR = 0.05  # the 1437 digits give far fewer steps an epoch


def metric_average(val: float, name: str) -> float:
    """The mean of ``val`` over all ranks."""
    import horovod.torch as hvd

    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return float(avg_tensor.item())


def train_mnist(settings: dict[str, Any]) -> dict[str, Any]:
    """The workshop script's body, on every rank. ``settings`` holds the parsed options.

    Returns:
        Per epoch (agreed over the ranks): ``train_loss``, ``test_loss``, ``accuracy`` and
        ``seconds``; plus ``ranks`` and the last ``checkpoint`` (rank 0).
    """
    import horovod.torch as hvd
    from torch.utils.data.distributed import DistributedSampler

    import sparktrain
    import sparktrain.checkpoint

    s = settings
    # Initialize Horovod
    hvd.init()
    torch.manual_seed(s["seed"])
    cuda = torch.cuda.is_available() and s["cuda"]
    if cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(s["seed"])
    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)
    device = torch.device("cuda" if cuda else "cpu")

    train_dataset, test_dataset = _data.load_mnist_like(s["data"], s["data_dir"])
    # Horovod: use DistributedSampler to partition the training data.
    train_sampler: DistributedSampler[Any] = DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=s["batch_size"], sampler=train_sampler
    )
    # Horovod: use DistributedSampler to partition the test data.
    test_sampler: DistributedSampler[Any] = DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
    )
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=s["test_batch_size"], sampler=test_sampler
    )

    model = Net().to(device)
    # Horovod: scale learning rate by the number of GPUs (Adasum: by the local size).
    lr_scaler = hvd.size() if not s["use_adasum"] else 1
    if cuda and s["use_adasum"] and hvd.nccl_built():
        lr_scaler = hvd.local_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=s["lr"] * lr_scaler, momentum=s["momentum"])

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if s["fp16_allreduce"] else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if s["use_adasum"] else hvd.Average,
        gradient_predivide_factor=s["gradient_predivide_factor"],
    )

    def train(epoch: int) -> float:
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        # The progress lines count the examples in this worker's partition (train_sampler).
        loss = train_one_epoch(model, device, train_loader, optimizer, epoch, s["log_interval"])
        return metric_average(loss, "avg_train_loss")

    def test() -> tuple[float, float]:
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                # sum up batch loss
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                # get the index of the max log-probability
                pred = output.data.max(1, keepdim=True)[1]
                test_accuracy += float(pred.eq(target.data.view_as(pred)).cpu().float().sum())

        # Horovod: use test_sampler to determine the number of examples in
        # this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")
        # Horovod: print output only on first rank.
        if hvd.rank() == 0:
            print(
                f"\nTest set: Average loss: {test_loss:.4f}, "
                f"Accuracy: {100.0 * test_accuracy:.2f}%\n",
                flush=True,
            )
        return test_loss, test_accuracy

    epochs: list[dict[str, Any]] = []
    saved = None
    for epoch in range(1, s["epochs"] + 1):
        began = time.perf_counter()
        train_loss = train(epoch)
        test_loss, accuracy = test()
        seconds = time.perf_counter() - began
        epochs.append(
            {
                "epoch": epoch,
                "train_loss": train_loss,
                "test_loss": test_loss,
                "accuracy": accuracy,
                "seconds": seconds,
            }
        )
        sparktrain.report(epoch=epoch, loss=train_loss, test_loss=test_loss, accuracy=accuracy)
        # Horovod: save checkpoints only on worker 0 to prevent other workers from
        # corrupting them.
        if hvd.rank() == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
            }
            saved = sparktrain.checkpoint.save(state, s["checkpoint_dir"], step=epoch, keep_last=2)
            sparktrain.log_to_driver(
                f"epoch {epoch}: train loss {train_loss:.4f}, test loss {test_loss:.4f}, "
                f"accuracy {accuracy:.2%}, {seconds:.2f} s"
            )
    return {"epochs": epochs, "ranks": hvd.size(), "checkpoint": saved}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the workshop's options, run it through HorovodRunner, print a summary.

    Returns:
        ``epochs`` (rows: epoch, train_loss, test_loss, accuracy, seconds), ``losses``
        (train loss per epoch), ``accuracy`` (last epoch), ``run_seconds``,
        ``checkpoint_dir``, ``checkpoint``, ``data``, ``np`` and the ``settings`` used.
    """
    from sparktrain import HorovodRunner

    parser = _common.make_parser(
        "torch_hvd_mnist",
        "The Horovod workshop's PyTorch MNIST example, through HorovodRunner.",
        epochs=3,
        batch_size=64,
        lr=None,
        lr_help=f"{WORKSHOP_LR} for MNIST as in the workshop, {DIGITS_LR} for the digits",
    )
    parser.add_argument(
        "--test-batch-size",
        type=int,
        default=1000,
        help="input batch size for testing (default 1000)",
    )
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (default 0.5)")
    parser.add_argument("--no-cuda", action="store_true", help="disables CUDA training")
    parser.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    parser.add_argument(
        "--log-interval",
        type=int,
        default=10,
        help="how many batches to wait before logging training status",
    )
    parser.add_argument(
        "--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce"
    )
    parser.add_argument(
        "--use-adasum", action="store_true", help="use adasum algorithm to do reduction"
    )
    parser.add_argument(
        "--gradient-predivide-factor",
        type=float,
        default=1.0,
        help="apply gradient predivide factor in optimizer (default 1.0)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="stream every rank's output, not only log_to_driver messages",
    )
    args = _common.parse(parser, argv)
    choice = _data.mnist_choice(args.data_dir)
    _common.require(args, *(["sklearn"] if choice.kind == "digits" else []))
    lr = args.lr if args.lr is not None else (WORKSHOP_LR if choice.kind == "mnist" else DIGITS_LR)
    settings = {
        "data": choice.kind,
        "data_dir": args.data_dir,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "test_batch_size": args.test_batch_size,
        "lr": lr,
        "momentum": args.momentum,
        "cuda": not args.no_cuda,
        "seed": args.seed,
        "log_interval": args.log_interval,
        "fp16_allreduce": args.fp16_allreduce,
        "use_adasum": args.use_adasum,
        "gradient_predivide_factor": args.gradient_predivide_factor,
        "checkpoint_dir": args.checkpoint_dir,
    }
    print(f"Data: {choice.description}", flush=True)
    print(
        f"Settings: {_common.where(args.np)}, {args.epochs} epochs, batch {args.batch_size} "
        f"per rank, lr {lr} x ranks, fp16 allreduce "
        f"{'on' if args.fp16_allreduce else 'off'}; checkpoints under {args.checkpoint_dir}",
        flush=True,
    )
    verbosity = "all" if args.verbose else "log_callback_only"
    with _common.spark_for(args.np, args.master) as spark:
        runner = HorovodRunner(np=args.np, driver_log_verbosity=verbosity, spark=spark)
        began = time.monotonic()
        result = runner.run(train_mnist, settings)
        run_seconds = time.monotonic() - began
    rows = result["epochs"]
    _common.print_table(
        rows,
        [
            ("epoch", "epoch", "d"),
            ("train_loss", "train loss", ".4f"),
            ("test_loss", "test loss", ".4f"),
            ("accuracy", "test accuracy", ".2%"),
            ("seconds", "time/epoch (s)", ".2f"),
        ],
        title="\nSummary",
    )
    print(f"{result['ranks']} ranks; the run took {run_seconds:.1f} s", flush=True)
    return {
        "epochs": rows,
        "losses": [r["train_loss"] for r in rows],
        "accuracy": rows[-1]["accuracy"] if rows else None,
        "run_seconds": run_seconds,
        "checkpoint_dir": args.checkpoint_dir,
        "checkpoint": result["checkpoint"],
        "data": choice.description,
        "np": args.np,
        "settings": settings,
    }


if __name__ == "__main__":
    # Run under the importable name, so cloudpickle ships train_mnist by reference.
    from sparktrain.examples import torch_hvd_mnist

    torch_hvd_mnist.main()
