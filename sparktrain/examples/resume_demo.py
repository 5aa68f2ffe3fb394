"""Train, lose a rank, watch the run resume from its last checkpoint.

    python -m sparktrain.examples.resume_demo            # 2 ranks on the driver
    python -m sparktrain.examples.resume_demo --np 2     # 2 ranks on an embedded local Spark
    python -m sparktrain.examples.resume_demo --elastic  # np=(1, 2): a host lost, then back

In the first attempt rank 1 is SIGKILLed in the middle of epoch 2 (as a preempted machine
would be). With ``max_restarts=2`` the runner launches every rank again; the function finds
the checkpoint of epoch 1 and carries on from epoch 2, so no epoch is skipped or run twice.

``--elastic`` runs ``np=(1, 2)`` on a ``local-cluster[2,1,1024]`` Spark of its own: one
executor is taken away for good in the middle of an epoch, the run goes on with 1 rank from
its newest checkpoint, the executor comes back a few seconds later and the run grows back to
2 ranks at its next checkpoint; the data's place is resumed exactly each time, and a table
at the end shows each attempt's size and why, its steps, and every epoch's rows counted per
row id (see :mod:`sparktrain.examples._elastic_demo`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from typing import Any


def train(ckpt_dir: str, epochs: int, steps_per_epoch: int) -> dict[str, Any]:
    """A tiny DDP regression that checkpoints every epoch and resumes from the latest one."""
    import torch
    import torch.distributed as dist

    import sparktrain
    from sparktrain import checkpoint

    dist.init_process_group(sparktrain.default_backend())
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start, steps = 0, 0
    latest = checkpoint.load_latest(ckpt_dir)
    if latest is not None:
        model.module.load_state_dict(latest.state["model"])
        optimizer.load_state_dict(latest.state["optimizer"])
        start, steps = latest.state["epoch"] + 1, latest.state["steps"]
        sparktrain.log_to_driver(
            f"attempt {sparktrain.attempt() + 1}: resuming at epoch {start} "
            f"from the checkpoint of step {latest.step}"
        )
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
    y = x.sum(dim=1, keepdim=True)
    for epoch in range(start, epochs):
        for step in range(steps_per_epoch):
            if sparktrain.attempt() == 0 and dist.get_rank() == 1 and (epoch, step) == (2, 3):
                os.kill(os.getpid(), signal.SIGKILL)  # the "preemption"
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
        sparktrain.log_to_driver(f"epoch {epoch}: loss {loss.item():.4f} after {steps} steps")
        checkpoint.save(
            {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "steps": steps,
            },
            ckpt_dir,
            step=steps,
            keep_last=2,
        )
        dist.barrier()
    dist.destroy_process_group()
    return {"steps": steps, "loss": float(loss), "attempt": sparktrain.attempt()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the demo; returns rank 0's result (with ``--elastic``, the tables' rows too)."""
    parser = argparse.ArgumentParser(
        prog="python -m sparktrain.examples.resume_demo",
        description="Kill a rank mid-training and resume; or, with --elastic, lose a host "
        "for good, go on smaller and grow back when it returns.",
    )
    parser.add_argument(
        "--np", type=int, default=None, help="ranks (negative: on the driver; default -2)"
    )
    parser.add_argument("--epochs", type=int, default=None, help="default 4 (--elastic: 3)")
    parser.add_argument("--steps-per-epoch", type=int, default=None, help="default 20")
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where checkpoints go (default: a new temporary directory)",
    )
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="np=(1, 2) on a local-cluster[2,1,1024] Spark of its own: an executor is taken "
        "away for good mid-epoch and given back; prints each attempt's size and the rows "
        "counted per epoch",
    )
    parser.add_argument(
        "--away",
        type=float,
        default=3.0,
        help="with --elastic: seconds the lost host stays away (default 3)",
    )
    args = parser.parse_args(argv)
    from sparktrain import private_dir

    if args.elastic:
        return _elastic(parser, args)
    if args.np is None:
        args.np = -2
    if args.np == 0:
        parser.error("--np must not be 0")
    args.epochs = 4 if args.epochs is None else args.epochs
    args.steps_per_epoch = 20 if args.steps_per_epoch is None else args.steps_per_epoch
    from sparktrain import SparkRunner

    spark = None
    if args.np > 0:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master(f"local-cluster[{args.np},1,1024]")
            .appName("sparktrain-resume-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    ckpt_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="resume-", dir=private_dir.root())
    try:
        runner = SparkRunner(
            np=args.np, max_restarts=2, driver_log_verbosity="log_callback_only", grace_period=2
        )
        result = runner.run(train, ckpt_dir, args.epochs, args.steps_per_epoch)
    finally:
        if spark is not None:
            spark.stop()
    failures = [a for a in runner.attempts if a.error is not None]
    print(
        f"finished in attempt {result['attempt'] + 1} after {len(failures)} "
        f"failure(s): {result['steps']} steps (expected {args.epochs * args.steps_per_epoch}),"
        f" final loss {result['loss']:.4f}; checkpoints in {ckpt_dir}"
    )
    return result


def _elastic(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The elastic mode: refuse what it does not take, then run it."""
    from sparktrain import private_dir
    from sparktrain.errors import ConfigurationError
    from sparktrain.examples import _elastic_cluster, _elastic_demo

    if args.np is not None:
        parser.error("--elastic runs np=(1, 2) on its own local-cluster: leave --np out")
    if args.steps_per_epoch is not None:
        parser.error(
            f"--elastic's epoch is its data ({_elastic_demo.ROWS} rows): leave "
            "--steps-per-epoch out"
        )
    epochs = 3 if args.epochs is None else args.epochs
    if epochs < 2:
        parser.error("--elastic loses its host in epoch 1: --epochs must be 2 or more")
    if not args.away >= 0:
        parser.error(f"--away must be a number of seconds >= 0; got {args.away}")
    ckpt = args.checkpoint_dir
    if ckpt is not None and os.path.isdir(ckpt) and os.listdir(ckpt):
        parser.error(
            f"--elastic starts from the beginning, but --checkpoint-dir {ckpt} holds files "
            "(an earlier run's checkpoints would be taken up): name a new or empty folder"
        )
    try:
        _elastic_cluster.check_local_cluster()  # before anything starts
    except ConfigurationError as exc:
        parser.error(str(exc))
    ckpt_dir = ckpt or tempfile.mkdtemp(prefix="resume-", dir=private_dir.root())
    return _elastic_demo.run(ckpt_dir, epochs, args.away)


if __name__ == "__main__":
    main()
