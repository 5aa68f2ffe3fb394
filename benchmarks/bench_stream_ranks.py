"""What each rank of ``bench_stream.py``'s paths runs: read every batch of its loader, timing
the first and each epoch's end, and measure its peak RSS; every rank's result comes back to the
driver. Shipped to the ranks by value (they need not import benchmarks/)."""

from __future__ import annotations

from typing import Any


def consume(batches: Any, epoch_of: Any, job: dict[str, Any]) -> dict[str, Any]:
    """On a rank: read every batch, timing the first and each epoch's end; rows per epoch."""
    import time

    opened = time.time()
    first: float | None = None
    ends: list[float] = []
    rows: list[int] = []
    step_s = job["step_ms"] / 1000
    checksum = 0.0
    for batch in batches:
        now = time.time()
        epoch = epoch_of()
        if first is None:
            first = now
        while len(rows) <= epoch:
            rows.append(0)
            ends.append(now)
        features = batch["features"]
        checksum += float(features[:, 0].sum())  # the step: every batch is touched
        if step_s:
            time.sleep(step_s)
        rows[epoch] += int(features.shape[0])
        ends[epoch] = time.time()
    starts = [opened, *ends[:-1]]
    return {
        "first": first if first is not None else float("nan"),
        "epochs": [end - start for start, end in zip(starts, ends, strict=True)],
        "rows": rows,
        "checksum": checksum,
    }


def measured(job: dict[str, Any], read: Any, join_first: bool = True) -> dict[str, Any]:
    """On a rank: join the process group, reset the peak RSS, ``read()``; every rank's result.

    ``read`` returns :func:`consume`'s dict and the bytes this rank spilled. With
    ``join_first=False``, ``read`` joins the group itself, once its loader is open (a loader
    opened before the group exists does not agree on its steps).
    """
    import torch.distributed as dist

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return -1

    if join_first:
        dist.init_process_group("gloo")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    before = status("VmRSS")
    result, spilled = read()
    result["peak"] = status("VmHWM") - before if reset else -1
    result["spill"] = spilled
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    dist.destroy_process_group()
    return {"ranks": everyone}


def rank_stream(data: Any, job: dict[str, Any]) -> dict[str, Any]:
    """On every rank: the stream's loader, ``num_epochs`` epochs in one pass."""

    import torch.distributed as dist

    def read() -> tuple[dict[str, Any], int]:
        spilled = [0]
        with data.loader() as batches:
            if not dist.is_initialized():  # only now: this loader's ranks do not agree
                dist.init_process_group("gloo")

            def epoch_of() -> int:
                # The spill is whole once epoch 1 begins: its size is what the rank wrote.
                if batches.epoch == 1 and not spilled[0]:
                    spill = getattr(getattr(batches, "_stream", None), "_spill", None)
                    path = getattr(spill, "path", None)
                    spilled[0] = path.stat().st_size if path is not None and path.exists() else 0
                return int(batches.epoch)

            result = consume(batches, epoch_of, job)
        return result, spilled[0]

    return measured(job, read, join_first=job["agree"])


def rank_converter(converter: Any, job: dict[str, Any]) -> dict[str, Any]:
    """On every rank: ``make_torch_dataloader`` read ``epochs`` times (one epoch a pass)."""

    def read() -> tuple[dict[str, Any], int]:
        epoch = [0]

        def passes() -> Any:
            with converter.make_torch_dataloader(
                job["batch_size"], num_epochs=1, shuffle=True, seed=job["seed"]
            ) as loader:
                for number in range(job["epochs"]):
                    epoch[0] = number
                    yield from loader

        return consume(passes(), lambda: epoch[0], job), 0

    return measured(job, read)


def rank_distributor(job: dict[str, Any]) -> dict[str, Any]:
    """On every rank of ``TorchDistributor._train_on_dataframe`` (a torchrun process): its
    partition's local Arrow file read through ``_get_spark_partition_data_loader``, once per
    epoch, ``rows // np`` rows each time (its loader wraps around where a partition is shorter:
    every rank takes the same steps). It does not shuffle; ``num_workers=0`` keeps the reading
    in the rank, so that its peak RSS counts it."""
    import os

    import torch.distributed as dist
    from pyspark.ml.torch.distributor import (
        SPARK_PARTITION_ARROW_DATA_FILE,
        _get_spark_partition_data_loader,
    )

    def read() -> tuple[dict[str, Any], int]:
        per_rank = job["rows"] // dist.get_world_size()
        epoch = [0]

        def passes() -> Any:
            for number in range(job["epochs"]):
                epoch[0] = number
                loader = _get_spark_partition_data_loader(
                    per_rank, job["batch_size"], num_workers=0
                )
                for features, label in loader:
                    yield {"features": features, "label": label}

        result = consume(passes(), lambda: epoch[0], job)
        return result, os.path.getsize(os.environ[SPARK_PARTITION_ARROW_DATA_FILE])

    return measured(job, read)


def rank_memory(job: dict[str, Any]) -> dict[str, Any]:
    """On every rank (the ceiling): its share of the rows made as tensors in the rank before the
    first epoch (counted in its peak RSS, not in its epochs), read in batches of the same size,
    shuffled every epoch."""
    import torch
    import torch.distributed as dist

    def read() -> tuple[dict[str, Any], int]:
        rank, size = dist.get_rank(), dist.get_world_size()
        rows = job["rows"] // size + (1 if rank < job["rows"] % size else 0)
        generator = torch.Generator().manual_seed(job["seed"] + rank)
        features = torch.rand(rows, job["features"], generator=generator)
        labels = torch.randint(0, 10, (rows,), generator=generator)
        epoch = [0]
        step = job["batch_size"]

        def passes() -> Any:
            for number in range(job["epochs"]):
                epoch[0] = number
                order = torch.randperm(rows, generator=generator)
                for start in range(0, rows, step):
                    index = order[start : start + step]
                    yield {"features": features[index], "label": labels[index]}

        return consume(passes(), lambda: epoch[0], job), 0

    return measured(job, read)


def warm_up(data: Any = None) -> int:
    """A run with nothing to measure: starts the Python workers each kind of stage uses."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rows = 0
    if data is not None:
        with data.loader() as batches:
            rows = sum(len(batch["label"]) for batch in batches)
    dist.destroy_process_group()
    return rows
