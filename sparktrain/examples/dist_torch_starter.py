"""A starter for your own distributed PyTorch job: replace the marked parts with yours.

The "workers" starter this comes from had you edit a line (``USE_GPU = False``) and the
number of workers before running it; here they are options: ``--gpus`` trains on one GPU per
rank with NCCL (every rank must have one), without it the ranks use their CPUs with Gloo;
``--np`` is the number of workers (negative: on this machine, without Spark).

Everything else is ordinary DistributedDataParallel code: ``train`` runs on every rank,
reports its metrics to the driver and returns rank 0's summary.

Run it::

    python -m sparktrain.examples.dist_torch_starter                # 2 CPU ranks on Spark
    python -m sparktrain.examples.dist_torch_starter --np 4 --gpus  # 4 GPU ranks on Spark
    python -m sparktrain.examples.dist_torch_starter --np -1 --gpus # 1 GPU here, no Spark
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sparktrain.examples import _common, _data


def get_data() -> tuple[Any, Any]:
    """YOUR DATA: ``(train, test)`` datasets. Here: the bundled digits as 64-pixel vectors."""
    from torch.utils.data import TensorDataset

    x_train, y_train, x_test, y_test = _data.digits_tensors()
    return (TensorDataset(x_train.flatten(1), y_train), TensorDataset(x_test.flatten(1), y_test))


def get_model() -> nn.Module:
    """YOUR MODEL. Here: a two-layer perceptron for the 64-pixel digits."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def train(
    epochs: int, lr: float, batch_size: int, gpus: bool, checkpoint_dir: str | None
) -> dict[str, Any]:
    """Runs on every worker: join the group, train with DDP, report, checkpoint on rank 0.

    Returns:
        ``losses`` and ``accuracies`` per epoch, ``device`` and ``ranks``.

    Raises:
        RuntimeError: ``gpus`` is set but this rank has no CUDA device.
    """
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    import sparktrain
    import sparktrain.checkpoint

    if gpus and not sparktrain.use_gpu():
        raise RuntimeError(
            f"--gpus was given, but rank {sparktrain.rank()} has no CUDA device "
            f"(torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}); "
            "run without --gpus to train on CPUs"
        )
    dist.init_process_group(sparktrain.default_backend())  # nccl with GPUs, else gloo
    rank, size = dist.get_rank(), dist.get_world_size()
    device = _common.rank_device()
    torch.manual_seed(0)

    train_set, test_set = get_data()
    sampler: DistributedSampler[Any] = DistributedSampler(
        train_set
    )  # rank and size come from the process group
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    test_loader = DataLoader(
        test_set, batch_size=512, sampler=DistributedSampler(test_set, shuffle=False)
    )
    model = get_model().to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)

    losses, accuracies = [], []
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        ddp.train()
        stats = torch.zeros(4, dtype=torch.float64, device=device)  # loss, n, correct, n
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            stats[0] += loss.item() * len(y)
            stats[1] += len(y)
        model.eval()
        with torch.no_grad():
            for x, y in test_loader:
                x, y = x.to(device), y.to(device)
                stats[2] += (model(x).argmax(1) == y).sum().item()
                stats[3] += len(y)
        dist.all_reduce(stats)
        losses.append(float(stats[0] / stats[1]))
        accuracies.append(float(stats[2] / stats[3]))
        sparktrain.report(epoch=epoch, loss=losses[-1], accuracy=accuracies[-1])
        if rank == 0:
            print(
                f"epoch {epoch}: loss {losses[-1]:.4f}, accuracy {accuracies[-1]:.2%}", flush=True
            )
            if checkpoint_dir:
                sparktrain.checkpoint.save(
                    {"model": model.state_dict()}, checkpoint_dir, step=epoch, keep_last=1
                )
    del ddp
    _common.shutdown_distributed()
    return {"losses": losses, "accuracies": accuracies, "device": str(device), "ranks": size}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run :func:`train` on ``--np`` workers; return rank 0's result and the wall time."""
    from sparktrain import SparkRunner

    parser = _common.make_parser(
        "dist_torch_starter",
        "A starter for distributed PyTorch on Spark workers.",
        epochs=5,
        batch_size=32,
        lr=0.05,
        data=False,
    )
    parser.add_argument(
        "--gpus",
        action="store_true",
        help="train on GPUs, one per rank, with NCCL (default: CPUs with Gloo)",
    )
    args = _common.parse(parser, argv)
    _common.require(args, "sklearn")
    if args.gpus and args.np < 0 and torch.cuda.device_count() < -args.np:
        parser.error(
            f"--gpus with --np {args.np} needs {-args.np} GPU(s) here, found "
            f"{torch.cuda.device_count()}; NCCL puts one rank on each GPU"
        )
    print(
        "Data: scikit-learn's bundled handwritten digits as 64-pixel vectors "
        f"({1797 - _data.DIGITS_TEST_SIZE} train / {_data.DIGITS_TEST_SIZE} test), "
        "no download",
        flush=True,
    )
    print(f"Workers: {_common.where(args.np)}, on {'GPUs' if args.gpus else 'CPUs'}", flush=True)
    with _common.spark_for(args.np, args.master) as spark:
        # use_gpu=True makes the runner insist on a GPU per rank; False hides them.
        runner = SparkRunner(np=args.np, spark=spark, use_gpu=bool(args.gpus))
        began = time.monotonic()
        result = runner.run(
            train, args.epochs, args.lr, args.batch_size, args.gpus, args.checkpoint_dir
        )
        run_seconds = time.monotonic() - began
    rows = [
        {"epoch": i + 1, "loss": loss, "accuracy": acc, "ranks": result["ranks"]}
        for i, (loss, acc) in enumerate(zip(result["losses"], result["accuracies"], strict=True))
    ]
    _common.print_table(
        rows, [c for c in _common.EPOCH_COLUMNS if c[0] != "seconds"], title="\nSummary"
    )
    print(
        f"Devices: {result['device']} on each of {result['ranks']} ranks; the run took "
        f"{run_seconds:.1f} s",
        flush=True,
    )
    return {
        **result,
        "run_seconds": run_seconds,
        "np": args.np,
        "gpus": args.gpus,
        "checkpoint_dir": args.checkpoint_dir,
    }


if __name__ == "__main__":
    # Run under the importable name, so cloudpickle ships train by reference.
    from sparktrain.examples import dist_torch_starter

    dist_torch_starter.main()
