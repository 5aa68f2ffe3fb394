"""Train, lose a rank, watch the run resume from its last checkpoint.

    python -m sparktrain.examples.resume_demo            # 2 ranks on the driver
    python -m sparktrain.examples.resume_demo --np 2     # 2 ranks on an embedded local Spark

In the first attempt rank 1 is SIGKILLed in the middle of epoch 2 (as a preempted machine
would be). With ``max_restarts=2`` the runner launches every rank again; the function finds
the checkpoint of epoch 1 and carries on from epoch 2, so no epoch is skipped or run twice.
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
            f"attempt {sparktrain.attempt()}: resuming at epoch {start} "
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
    """Run the demo; returns rank 0's result."""
    parser = argparse.ArgumentParser(description="Kill a rank mid-training and resume.")
    parser.add_argument("--np", type=int, default=-2, help="ranks (negative: on the driver)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where checkpoints go (default: a new temporary directory)",
    )
    args = parser.parse_args(argv)
    from sparktrain import SparkRunner, private_dir

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


if __name__ == "__main__":
    main()
