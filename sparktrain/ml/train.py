"""The training loop that :class:`~sparktrain.ml.TorchEstimator` runs on every rank.

It runs in the ranks' processes, so it never imports pyspark: the data comes through the
converter's Parquet files or the task's stream, the settings in a :class:`TrainJob`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sparktrain.data.dataset import SparkDatasetConverter
from sparktrain.data.frame_source import DataFrameSource

FEATURES = "features"
LABEL = "label"


@dataclasses.dataclass(frozen=True)
class TrainJob:
    """Everything a rank needs to train, as picklable data.

    Attributes:
        model_factory: builds the ``torch.nn.Module``.
        loss: a loss name of :data:`sparktrain.ml.params.LOSSES` or a function.
        optimizer_factory: ``(parameters) -> Optimizer``, or None for Adam(learning_rate).
        learning_rate: the default optimizer's learning rate.
        train: the training rows (``features`` as float arrays, ``label``): a converter's
            cache, or the DataFrame itself, streamed (``dataSource="stream"``).
        validation: held-out rows, or None.
        batch_size: rows per batch on each rank.
        epochs: passes over ``train``.
        backend: ``"torch"`` or ``"horovod"``.
        task: ``"classification"`` or ``"regression"``.
        input_shape: one row's shape for the model, or None for the flat array.
        checkpoint_dir: where to save a checkpoint each epoch (and resume from), or None.
        seed: seeds the model's initialization and the shuffle.
    """

    model_factory: Callable[[], Any]
    loss: Any
    optimizer_factory: Callable[[Any], Any] | None
    learning_rate: float
    train: SparkDatasetConverter | DataFrameSource
    validation: SparkDatasetConverter | None
    batch_size: int
    epochs: int
    backend: str
    task: str
    input_shape: tuple[int, ...] | None
    checkpoint_dir: str | None
    seed: int


def loss_function(loss: Any) -> Callable[[Any, Any], Any]:
    """The loss as a function ``(output, label) -> tensor``."""
    import torch.nn.functional as F

    if callable(loss):
        return loss
    losses: dict[str, Callable[..., Any]] = {
        "cross_entropy": F.cross_entropy,
        "nll": F.nll_loss,
        "mse": F.mse_loss,
        "l1": F.l1_loss,
        "smooth_l1": F.smooth_l1_loss,
    }
    return losses[loss]


class _Ranks:
    """The few collective steps the loop needs, for torch.distributed or Horovod."""

    def __init__(self, backend: str) -> None:
        self.horovod = backend == "horovod"
        if self.horovod:
            import horovod.torch as hvd

            hvd.init()
            self.rank, self.size = hvd.rank(), hvd.size()
        else:
            import torch.distributed as dist

            from sparktrain.worker import context

            dist.init_process_group(context.default_backend())
            self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def wrap(self, model: Any, optimizer: Any, device: Any) -> tuple[Any, Any]:
        """The model and optimizer that average gradients over the ranks."""
        if self.horovod:
            import horovod.torch as hvd

            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            return model, hvd.DistributedOptimizer(
                optimizer, named_parameters=model.named_parameters()
            )
        import torch

        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids), optimizer

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the ranks."""
        import torch

        tensor = torch.tensor(values, dtype=torch.float64)
        if self.horovod:
            import horovod.torch as hvd

            summed: list[float] = hvd.allreduce(tensor, op=hvd.Sum).tolist()
            return summed
        import torch.distributed as dist

        dist.all_reduce(tensor)
        total: list[float] = tensor.tolist()
        return total


def _device() -> Any:
    import torch

    from sparktrain.worker import context

    if context.use_gpu() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _prepare(job: TrainJob, batch: dict[str, Any], device: Any) -> tuple[Any, Any]:
    features = batch[FEATURES].to(device)
    if job.input_shape:
        features = features.reshape(-1, *job.input_shape)
    label = batch[LABEL].to(device)
    label = label.long() if job.task == "classification" else label.float()
    return features, label


def _loss(job: TrainJob, loss_fn: Callable[[Any, Any], Any], output: Any, label: Any) -> Any:
    if job.task == "regression" and output.numel() == label.numel():
        output = output.reshape(label.shape)
    return loss_fn(output, label)


def _validate(job: TrainJob, model: Any, device: Any) -> dict[str, float]:
    """Loss (and accuracy) over every held-out row, on this rank alone."""
    import torch

    assert job.validation is not None
    loss_fn = loss_function(job.loss)
    total = correct = 0
    loss_sum = 0.0
    model.eval()
    options = {"shuffle": False, "cur_shard": 0, "shard_count": 1}
    with torch.no_grad(), job.validation.make_torch_dataloader(job.batch_size, **options) as rows:
        for batch in rows:
            features, label = _prepare(job, batch, device)
            output = model(features)
            loss_sum += float(_loss(job, loss_fn, output, label)) * len(label)
            total += len(label)
            if job.task == "classification":
                correct += int((output.argmax(dim=1) == label).sum())
    model.train()
    metrics = {"val_loss": loss_sum / max(total, 1)}
    if job.task == "classification":
        metrics["val_accuracy"] = correct / max(total, 1)
    return metrics


@contextlib.contextmanager
def _epochs(job: TrainJob, start: int) -> Iterator[Iterator[tuple[int, Iterable[Any]]]]:
    """Each epoch from ``start`` on, with its batches, from the cache or the stream."""
    if isinstance(job.train, DataFrameSource):
        with job.train.loader() as stream:
            stream.load_state_dict({**stream.state_dict(), "epoch": start, "steps": 0})
            yield ((epoch, stream.next_epoch()) for epoch in range(start, job.epochs))
        return
    with job.train.make_torch_dataloader(job.batch_size, seed=job.seed) as loader:

        def each() -> Iterator[tuple[int, Iterable[Any]]]:
            for epoch in range(start, job.epochs):
                loader.set_epoch(epoch)
                yield epoch, loader

        yield each()


def train_on_rank(job: TrainJob, data: DataFrameSource | None = None) -> dict[str, Any]:
    """Train ``job`` on this rank; rank 0 returns ``{"state": state_dict, "history": [...]}``.

    ``data``: ``job.train`` again when it is a DataFrame's stream (which the runner looks for
    among the function's arguments)."""
    import torch

    from sparktrain import checkpoint
    from sparktrain.worker import context

    ranks = _Ranks(job.backend)
    device = _device()
    torch.manual_seed(job.seed)
    model = job.model_factory().to(device)
    if job.optimizer_factory is not None:
        optimizer = job.optimizer_factory(model.parameters())
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=job.learning_rate)
    start, history = 0, []
    if job.checkpoint_dir:
        found = checkpoint.load_latest(job.checkpoint_dir, map_location=device)
        if found is not None:
            model.load_state_dict(found.state["model"])
            optimizer.load_state_dict(found.state["optimizer"])
            start, history = found.state["epoch"] + 1, list(found.state["history"])
            context.log_to_driver(f"resuming at epoch {start} from {found.path}")
    trained, optimizer = ranks.wrap(model, optimizer, device)
    loss_fn = loss_function(job.loss)
    trained.train()
    with _epochs(job, start) as epochs:
        for epoch, batches in epochs:
            loss_sum, rows = 0.0, 0
            for batch in batches:
                features, label = _prepare(job, batch, device)
                optimizer.zero_grad()
                loss = _loss(job, loss_fn, trained(features), label)
                loss.backward()
                optimizer.step()
                loss_sum += float(loss.detach()) * len(label)
                rows += len(label)
            loss_total, rows_total = ranks.sum([loss_sum, rows])
            record: dict[str, Any] = {"epoch": epoch, "loss": loss_total / max(rows_total, 1)}
            if job.validation is not None and ranks.rank == 0:
                record.update(_validate(job, model, device))
            if ranks.rank == 0:
                history.append(record)
                context.report(**record)
            if job.checkpoint_dir:
                state = {"epoch": epoch, "history": history}
                state.update(model=model.state_dict(), optimizer=optimizer.state_dict())
                checkpoint.save(state, job.checkpoint_dir, step=epoch, keep_last=2)
    weights = {name: value.detach().cpu() for name, value in model.state_dict().items()}
    return {"state": weights, "history": history}
