"""resume_demo's elastic mode: a host lost for good, the run going on smaller, growing back.

The driver starts an embedded ``local-cluster[2,1,1024]`` Spark (two executor JVMs) and runs
``SparkRunner(np=(1, 2))``. Beside the run, an operator thread plays the cluster: once the
first attempt is in the middle of epoch 1 it takes one executor away with ``killExecutor``
(which, unlike a crash, tells Spark not to replace it: a host preempted for good), and a few
seconds after the smaller attempt's first checkpoint it gives the executor back with
``requestTotalExecutors``. The run restarts on 1 rank from its newest checkpoint, then grows
back to 2 ranks at a checkpoint once the slot is free.

The ranks train a tiny DDP regression over 256 generated rows with
:class:`~sparktrain.data.ResumableDistributedSampler`, save a checkpoint every 4 steps with the
sampler's place, and keep a count per row id and epoch beside the model: the counts of a
checkpoint are summed over the ranks, so the rows a lost attempt trained after its last
checkpoint are forgotten with the model's steps, and the end shows that every epoch trained
each row once, across three sizes.

So that the story happens the same way on a fast or a busy machine, the ranks wait at two
points, each for at most ``hold`` seconds (then they go on as if nothing happened): the first
attempt, two steps after its checkpoint in the middle of epoch 1, waits for its host to be
taken away; a smaller attempt waits before its second checkpoint for the host to be back,
and after it for the driver's stop to grow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparktrain.examples._common import print_table, shutdown_distributed
from sparktrain.examples._elastic_cluster import (
    BACK,
    EXECUTORS,
    Operator,
    check_local_cluster,
    flat_report,
    start_session,
)

ROWS = 256  # the data set: generated rows, each with its id
BATCH = 8  # rows per rank and step
EVERY = 4  # a checkpoint every EVERY steps, and at the end of each epoch
HOLD_AT = (1, 10)  # (epoch, step in it) where the first attempt waits to lose its host
STOP_WAIT = 30.0  # seconds a rank waits for the stop after the checkpoint to grow at


# --------------------------------------------------------------------------- on the ranks


def train_elastic(
    ckpt_dir: str, marks: str, epochs: int, high: int, hold: float
) -> dict[str, Any] | None:
    """Train, checkpoint every few steps with the sampler's place, resume at any size.

    Args:
        ckpt_dir: the run's checkpoint directory.
        marks: the folder where the driver's operator says the host is back (:data:`BACK`).
        epochs: epochs of :data:`ROWS` rows.
        high: the run's largest size (an attempt below it waits for the host to return).
        hold: the most seconds a rank waits at one of the demo's two waiting points.

    Returns:
        Rank 0's summary: steps, loss, attempt, size, and per epoch the rows seen, seen
        twice and never seen, counted per row id over the ranks; None for an attempt that
        was stopped (its host lost, or to grow).
    """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    import sparktrain
    from sparktrain import checkpoint
    from sparktrain.data import ResumableDistributedSampler

    sparktrain.should_stop()  # from here on a stop (a lost peer, a grow) sets a flag
    dist.init_process_group(sparktrain.default_backend())
    attempt, size, lead = sparktrain.attempt(), dist.get_world_size(), dist.get_rank() == 0
    x = torch.randn(ROWS, 8, generator=torch.Generator().manual_seed(1234))
    data = TensorDataset(torch.arange(ROWS), x, x.sum(dim=1, keepdim=True))
    sampler = ResumableDistributedSampler(data, seed=7)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counted = torch.zeros(epochs, ROWS, dtype=torch.int64)  # per epoch and row id, all ranks
    start, steps = 0, 0
    latest = checkpoint.load_latest(ckpt_dir)
    if latest is not None:
        model.module.load_state_dict(latest.state["model"])
        optimizer.load_state_dict(latest.state["optimizer"])
        sampler.load_state_dict(latest.state["loader"])  # saved at any size, read at this one
        start, steps, counted = latest.state["epoch"], latest.state["steps"], latest.state["rows"]

    def tell(line: str = "", **flags: float) -> None:
        """Rank 0's line for the driver, and its report (the operator and the table read it)."""
        if lead:
            if line:
                sparktrain.log_to_driver(line)
            sparktrain.report(step=steps, epoch=epoch, attempt=attempt, size=size, **flags)

    epoch = start
    where = "at the start" if latest is None else f"from checkpoint {latest.step}"
    tell(f"attempt {attempt + 1}: {_ranks(size)}, epoch {start} {where}", start=1)
    pending = torch.zeros_like(counted)  # rows trained since the last checkpoint
    loss = torch.zeros(())
    saves = 0
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)  # a restored epoch keeps its place
        batches = len(loader)
        for index, (ids, xb, yb) in enumerate(loader, 1):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            steps += 1
            pending[epoch].index_add_(0, ids, torch.ones_like(ids))
            tell()
            if attempt == 0 and (epoch, index) == HOLD_AT:
                tell(f"epoch {epoch}, step {steps}: waiting here to lose a host", holding=1)
                if _hold(sparktrain.should_stop, hold):
                    return None  # a host is gone: this rank was stopped
            elif sparktrain.should_stop():
                return None
            if steps % EVERY and index < batches:
                continue
            if size < high and saves == 1:
                _hold(lambda: os.path.exists(os.path.join(marks, BACK)), hold)
            dist.all_reduce(pending)
            counted += pending
            pending.zero_()
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch + (index == batches),  # the epoch to go on with
                "steps": steps,
                "rows": counted,
            }
            checkpoint.save(state, ckpt_dir, step=steps, keep_last=2, loader=sampler)
            saves += 1
            tell(f"checkpoint {steps} saved (epoch {epoch})" if size < high else "", saved=1)
            if size < high and saves == 2 and _hold(sparktrain.should_stop, STOP_WAIT):
                return None  # stopped after that checkpoint, to be launched larger
        tell(f"epoch {epoch}: loss {loss.item():.4f} after {steps} steps on {_ranks(size)}")
    shutdown_distributed()
    once = [
        {
            "epoch": e,
            "rows": ROWS,
            "seen": int((counted[e] > 0).sum()),
            "twice": int((counted[e] > 1).sum()),
            "skipped": int((counted[e] == 0).sum()),
        }
        for e in range(epochs)
    ]
    return {"steps": steps, "loss": float(loss), "attempt": attempt, "size": size, "epochs": once}


def _hold(condition: Callable[[], bool], seconds: float) -> bool:
    """Wait until ``condition()`` (True) or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # neither a stop flag nor a file has an event a rank can wait on
    return True


def _ranks(size: int) -> str:
    return "1 rank" if size == 1 else f"{size} ranks"


# --------------------------------------------------------------------------- on the driver


def run(ckpt_dir: str, epochs: int, away: float, hold: float = 300.0) -> dict[str, Any]:
    """Run the elastic demo on a local-cluster of its own; print what happened.

    Args:
        ckpt_dir: where the checkpoints go.
        epochs: epochs of :data:`ROWS` rows.
        away: seconds the lost host stays away.
        hold: the most seconds the ranks wait at each waiting point, and the operator at
            each of its steps (less, so that its error comes first).

    Returns:
        The sizes, a row per attempt and per epoch (as printed), and rank 0's result.

    Raises:
        ConfigurationError: this Python cannot start a local-cluster master (before any).
        CapacityError: the executors did not come (back) in time.
    """
    from sparktrain import SparkRunner, private_dir

    check_local_cluster()
    limit = hold * 0.8
    session = start_session(limit)
    marks = tempfile.mkdtemp(prefix="resume-elastic-", dir=private_dir.root())
    try:
        runner = SparkRunner(
            np=(1, EXECUTORS),
            spark=session,
            max_restarts=2,
            resize_interval=1,
            grace_period=5,
            driver_log_verbosity="log_callback_only",
            timeout=4 * hold,
        )
        operator = Operator(session, marks, away, limit)
        handle = runner.submit(train_elastic, ckpt_dir, marks, epochs, EXECUTORS, hold)
        operator.start(handle)
        try:
            handle.follow(last=1000)
            if not handle.done():  # Ctrl-C while following: stop the run too
                handle.cancel()
                raise KeyboardInterrupt
        finally:
            operator.stop()
        if operator.error is not None:
            raise operator.error
        result = handle.result()
    finally:
        session.stop()
        shutil.rmtree(marks, ignore_errors=True)
    return summarize(handle.last_run, result, ckpt_dir)


def summarize(record: Any, result: Mapping[str, Any], ckpt_dir: str) -> dict[str, Any]:
    """Print a table of the attempts and one of the rows per epoch; return their rows."""
    reports = [flat_report(row) for row in record.reports]
    firsts = [_first_step(reports, a.attempt) for a in record.attempts]
    attempts, kept_sizes = [], {}  # type: list[dict[str, Any]], dict[int, list[int]]
    for a, first in zip(record.attempts, firsts, strict=True):
        steps = [r["step"] for r in reports if r["attempt"] == a.attempt]
        reached = max(steps, default=first)
        last = a.attempt == len(record.attempts) - 1
        kept_to = reached if last else firsts[a.attempt + 1]
        for r in reports:
            if r["attempt"] == a.attempt and first < r["step"] <= kept_to:
                sizes = kept_sizes.setdefault(r["epoch"], [])
                if not sizes or sizes[-1] != r["size"]:
                    sizes.append(r["size"])
        attempts.append(
            {
                "attempt": a.attempt + 1,
                "ranks": a.world_size,
                "why": _why(record.attempts, a.attempt, first),
                "steps": f"{first} -> {reached}" if steps else "none",
                "again": max(0, reached - kept_to),
                "ended": _ended(a, kept_to),
            }
        )
    print_table(
        attempts,
        [
            ("attempt", "attempt", "d"),
            ("ranks", "ranks", "d"),
            ("why", "why this size", "s"),
            ("steps", "steps", "s"),
            ("again", "done again", "d"),
            ("ended", "ended", "s"),
        ],
        title="\nAttempts",
    )
    epochs = [
        {**row, "sizes": " -> ".join(map(str, kept_sizes.get(row["epoch"], [])))}
        for row in result["epochs"]
    ]
    print_table(
        epochs,
        [
            ("epoch", "epoch", "d"),
            ("rows", "rows", "d"),
            ("seen", "seen", "d"),
            ("twice", "twice", "d"),
            ("skipped", "skipped", "d"),
            ("sizes", "ranks", "s"),
        ],
        title="\nRows per epoch, counted per row id on the ranks",
    )
    sizes = [a.world_size for a in record.attempts]
    again = sum(row["again"] for row in attempts)
    print(
        f"\nsizes {sizes}; {result['steps']} steps, {again} done again after the loss; "
        f"rows twice {sum(e['twice'] for e in epochs)}, "
        f"skipped {sum(e['skipped'] for e in epochs)}; checkpoints in {ckpt_dir}",
        flush=True,
    )
    return {"sizes": sizes, "attempts": attempts, "epochs": epochs, "result": dict(result)}


def _first_step(reports: Sequence[Mapping[str, Any]], attempt: int) -> int:
    """The step an attempt started from (0, or its checkpoint's)."""
    starts = [r["step"] for r in reports if r["attempt"] == attempt and r.get("start")]
    return starts[0] if starts else 0


def _why(attempts: Sequence[Any], index: int, first: int) -> str:
    if index == 0:
        return "the free task slots"
    if attempts[index - 1].resized:
        return f"a slot came free (checkpoint {first})"
    return "restart on what is left"


def _ended(attempt: Any, kept_to: int) -> str:
    if attempt.error is None:
        return "finished"
    if attempt.resized:
        return f"stopped to grow after checkpoint {kept_to}"
    cause = (attempt.cause or "failed").split(":")[0]  # e.g. "rank 1 on HOST was lost"
    return f"{cause}; back to checkpoint {kept_to}"
