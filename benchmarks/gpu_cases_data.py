"""The cases of ``gpu_suite.py`` that need no rank launch of their own but the
mixed-precision one: batches to the GPU, inference, mixed precision (checkpoints are in
:mod:`gpu_cases_checkpoint`). Rows as in :mod:`gpu_cases`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_workloads as work
from gpu_cases import Context, require, row, target, timed_call

# --- batches to the GPU -----------------------------------------------------------------


def _mnist_arrays(rows: int) -> tuple[Any, Any]:
    """``(images as (rows, 784) float32, labels as int64)`` of generated MNIST-sized data."""
    train, _ = work.generated_mnist(rows, 1)
    images, labels = train.tensors
    return images.reshape(rows, 784).numpy(), labels.numpy()


def _list_column(matrix: Any) -> Any:
    """A (rows, width) array as an Arrow ``list<float>`` column, as Spark writes arrays."""
    import numpy as np
    import pyarrow as pa

    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, (rows + 1) * width, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel()))


def _trainer(ctx: Context) -> Callable[[Any, Any], None]:
    """One SGD step of the seeds' CNN on a batch of flat images, on the case's device."""
    import torch
    import torch.nn.functional as F

    device = work.device_of(ctx.cuda)
    model = work.small_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(images: Any, labels: Any) -> None:
        images = images.to(device, non_blocking=True).reshape(-1, 1, 28, 28)
        optimizer.zero_grad()
        F.nll_loss(model(images), labels.to(device, non_blocking=True)).backward()
        optimizer.step()

    return step


def _rate(ctx: Context, epoch: Callable[[Callable[[Any, Any], None]], int]) -> float:
    """Samples a second of the second of two epochs (the first warms up)."""
    step = _trainer(ctx)
    epoch(step)
    began = time.perf_counter()
    samples = epoch(step)
    work.sync(work.device_of(ctx.cuda))
    require(samples == ctx.size["rows"], f"an epoch gave {samples} samples, not all the rows")
    return samples / (time.perf_counter() - began)


def loader_case(ctx: Context) -> list[dict[str, Any]]:
    """make_torch_dataloader over local Parquet against a pinned TensorDataset DataLoader and
    against tensors already on the device, each feeding the CNN at batch 512."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from sparktrain.data import SparkDatasetConverter

    rows, batch = ctx.size["rows"], 512
    images, labels = _mnist_arrays(rows)
    folder = ctx.scratch / "parquet"
    folder.mkdir()
    table = pa.table({"image": _list_column(images), "label": pa.array(labels)})
    pq.write_table(table, folder / "part-0.parquet", row_group_size=4096)
    converter = SparkDatasetConverter.from_parquet(str(folder), dtype="float32")

    def parquet(step: Callable[[Any, Any], None]) -> int:
        with converter.make_torch_dataloader(
            batch, num_epochs=1, shuffle=True, cur_shard=0, shard_count=1
        ) as loader:
            return sum(step(b["image"], b["label"]) or len(b["label"]) for b in loader)

    data = TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
    pinned = DataLoader(data, batch_size=batch, shuffle=True, pin_memory=ctx.cuda)
    on_device = [t.to(work.device_of(ctx.cuda)) for t in data.tensors]

    def from_pinned(step: Callable[[Any, Any], None]) -> int:
        return sum(step(x, y) or len(y) for x, y in pinned)

    def from_device(step: Callable[[Any, Any], None]) -> int:
        order = torch.randperm(rows, device=on_device[0].device)
        chunks = [order[i : i + batch] for i in range(0, rows, batch)]
        return sum(step(on_device[0][i], on_device[1][i]) or len(i) for i in chunks)

    ours = _rate(ctx, parquet)
    name = "make_torch_dataloader (local Parquet) -> CNN, batch 512 (samples/s)"
    rows_out = [
        row(
            name,
            ours,
            _rate(ctx, from_pinned),
            peer_name="TensorDataset DataLoader, pin_memory=True",
            target=target("ratio>=", 0.95, ">= 0.95x pinned"),
        ),
        row(name, ours, _rate(ctx, from_device), peer_name="tensors already on the device"),
    ]
    stream_name = "from_dataframe's stream (Arrow batches fed on the driver) -> CNN (samples/s)"

    def streamed(step: Callable[[Any, Any], None]) -> int:
        return _stream_epoch(table, batch, ctx.scratch, step)

    return rows_out + [
        row(
            stream_name,
            _rate(ctx, streamed),
            _rate(ctx, from_pinned),
            peer_name="TensorDataset DataLoader, pin_memory=True",
            target=target("ratio>=", 0.95, ">= 0.95x pinned"),
        )
    ]


def _stream_epoch(table: Any, batch: int, scratch: Path, step: Callable[[Any, Any], None]) -> int:
    """One epoch of ``table`` through the stream a run given a DataFrame uses on the driver
    (np < 0): a feeder thread sends Arrow batches, the rank's loader cuts and shuffles them
    into tensors. No Spark: the device machines have none, and this is the part on them."""
    import threading

    from sparktrain.data.stream import Feeder, RankStream

    key = os.urandom(32)
    with Feeder(1, key, parent=scratch) as feeder:
        sender = threading.Thread(
            target=feeder.feed, args=(table.to_batches(max_chunksize=4096),), daemon=True
        )
        sender.start()
        with RankStream(
            feeder.address, 0, batch, key=key, shuffle_buffer=4096, seed=0, spill=False
        ) as loader:
            samples = sum(step(b["image"], b["label"]) or len(b["label"]) for b in loader)
        sender.join()
    return samples


# --- inference ----------------------------------------------------------------------------


def inference_case(ctx: Context) -> list[dict[str, Any]]:
    """The predictor (what TorchModel and predict_udf run on an executor) on the device,
    against a hand-written loop: the same model, batches and Arrow input."""
    import cloudpickle
    import numpy as np
    import torch

    from sparktrain.inference import predictor

    device = work.device_of(ctx.cuda)
    model = work.small_cnn().eval()
    rows, batch = ctx.size["rows"], ctx.size["infer_batch"]
    images, _ = _mnist_arrays(rows)
    step = 10_000  # Spark's Arrow batch (spark.sql.execution.arrow.maxRecordsPerBatch)
    chunks = [_list_column(images[i : i + step]) for i in range(0, rows, step)]
    spec = predictor.ModelSpec.build(
        cloudpickle.dumps((model, None)),
        task="classification",
        batch_size=batch,
        input_shape=(1, 28, 28),
        device="cuda" if ctx.cuda else "cpu",
        log_probabilities=True,
    )

    def ours() -> Any:
        out = list(predictor.predict_arrow(spec, iter(chunks)))
        return np.concatenate([a.field("prediction").to_numpy() for a in out])

    mine = model.to(device)

    def by_hand() -> Any:
        predictions = []
        with torch.inference_mode():
            for chunk in chunks:
                flat = chunk.flatten().to_numpy().reshape(len(chunk), 784)
                for i in range(0, len(flat), batch):
                    x = torch.from_numpy(flat[i : i + batch]).to(device).reshape(-1, 1, 28, 28)
                    probabilities = mine(x).exp()
                    predictions.append(probabilities.argmax(dim=1).double().cpu().numpy())
        return np.concatenate(predictions)

    rates, predictions = [], []
    for fn in (ours, by_hand):
        first = fn()  # builds the model, warms the device
        began = time.perf_counter()
        predictions.append(fn())
        rates.append(rows / (time.perf_counter() - began))
        require((first == predictions[-1]).all(), "predictions differ between two passes")
    require((predictions[0] == predictions[1]).all(), "the predictor and the loop disagree")
    name = f"predictor (predict_arrow) on {device}, batch {batch} (rows/s)"
    return [
        row(
            name,
            rates[0],
            rates[1],
            peer_name="hand-written loop, same model",
            note="classification: prediction and probabilities",
        )
    ]


# --- mixed precision ----------------------------------------------------------------------


def amp_case(ctx: Context) -> list[dict[str, Any]]:
    """The CNN under torch.autocast(bfloat16) in a rank and in this plain process."""
    spec = {"cuda": ctx.cuda, "batch": ctx.size["batch"], "warmup": ctx.size["amp_warmup"]}
    spec["steps"] = ctx.size["amp_steps"]
    plain = work.amp_steps(spec)
    _, _, ours = timed_call(ctx.runner(), work.amp_steps, spec)
    for who, seen in (("the rank", ours), ("the plain process", plain)):
        require(seen["dtype"] == "torch.bfloat16", f"autocast gave {seen['dtype']} in {who}")
    gain = f"bf16 over fp32: {ours['fp32_s'] / ours['bf16_s']:.2f}x in the rank, "
    gain += f"{plain['fp32_s'] / plain['bf16_s']:.2f}x plain"
    peer = "the same steps in the suite's own process"
    return [
        row(
            f"bf16 autocast CNN step, batch {spec['batch']} (ms)",
            1e3 * ours["bf16_s"],
            1e3 * plain["bf16_s"],
            peer_name=peer,
            note=f"first convolution bfloat16 in both; {gain}",
            target=target("ratio<=", 1.05, "<= 1.05x plain"),
        ),
        row(
            f"fp32 CNN step, batch {spec['batch']} (ms)",
            1e3 * ours["fp32_s"],
            1e3 * plain["fp32_s"],
            peer_name=peer,
        ),
    ]
