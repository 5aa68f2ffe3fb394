"""Executor side of batched inference: the model loaded once per Python worker, then batches.

Runs inside Spark's Python workers (through the UDF of :mod:`sparktrain.inference.udf`); it
imports pyspark only to ask the task which GPU it was given. Spark reuses a Python worker
for the tasks of an executor (``spark.python.worker.reuse``, on by default), so the model
built by the first task is kept in :data:`_MODELS` and reused by the next tasks and batches.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from sparktrain.errors import ConfigurationError

TASKS = ("raw", "regression", "classification")
DEVICES = ("auto", "cpu", "cuda")
_CACHE_SIZE = 4

# The models built in this process, newest last. It is the one process-wide cache of the
# package, on purpose: it is what keeps the model from being rebuilt for each task.
_MODELS: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
_MODELS_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a Python worker needs to build the model and run it, as plain picklable data.

    Attributes:
        model: cloudpickle of ``(module or zero-argument factory, state_dict or None)``.
        key: a digest of ``model``, so a worker recognises a model it already built.
        task: ``"raw"`` (the outputs, flattened, as ``array<float>``), ``"regression"`` (one
            number per row, ``double``) or ``"classification"`` (a struct of ``prediction``,
            the argmax as ``double``, and ``probability``, the softmax of the outputs).
        batch_size: rows per forward pass.
        input_shape: the shape of one row's features given to the model (``None``: flat).
        device: ``"auto"`` (the task's GPU when it has one, else CPU), ``"cpu"`` or ``"cuda"``.
        log_probabilities: the model outputs log-probabilities (NLL loss): ``exp`` instead
            of ``softmax`` gives the probabilities.
    """

    model: bytes
    key: str
    task: str = "raw"
    batch_size: int = 1024
    input_shape: tuple[int, ...] | None = None
    device: str = "auto"
    log_probabilities: bool = False

    @classmethod
    def build(cls, model: bytes, **options: Any) -> ModelSpec:
        """A spec for the pickled model, its key made from the bytes and the options."""
        digest = hashlib.sha256(model)
        digest.update(repr(sorted(options.items())).encode())
        return cls(model=model, key=digest.hexdigest()[:32], **options)


def task_device(requested: str) -> str:
    """The torch device for this Spark task: its GPU (``spark.task.resource.gpu``) if any."""
    if requested == "cpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        if requested == "cuda":
            raise ConfigurationError(
                "device='cuda' was asked for inference, but torch sees no GPU on this "
                "executor; use device='auto' to fall back to the CPU"
            )
        return "cpu"
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        gpus = context.resources().get("gpu") if context is not None else None
    except ImportError:
        gpus = None
    if gpus is not None and gpus.addresses:
        return f"cuda:{gpus.addresses[0]}"
    return "cuda"


def load_model(spec: ModelSpec) -> tuple[Any, str]:
    """``(model, device)``: built once per process and device, then taken from the cache."""
    device = task_device(spec.device)
    with _MODELS_LOCK:
        cached = _MODELS.get((spec.key, device))
        if cached is not None:
            _MODELS.move_to_end((spec.key, device))
            return cached, device
    import cloudpickle
    import torch

    built, state = cloudpickle.loads(spec.model)
    model = built if isinstance(built, torch.nn.Module) else built()
    if state is not None:
        model.load_state_dict(state)
    model = model.to(device).eval()
    with _MODELS_LOCK:
        _MODELS[(spec.key, device)] = model
        while len(_MODELS) > _CACHE_SIZE:
            _MODELS.popitem(last=False)
    return model, device


def features_matrix(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 2-D float array from an Arrow list column, without copying where Arrow allows.

    Raises:
        ConfigurationError: a null row, or rows of different lengths.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if len(array) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        if pa.types.is_fixed_size_list(array.type):
            width = array.type.list_size
            values = array.flatten().to_numpy(zero_copy_only=False)
            return values.reshape(len(array), width)
        raise ConfigurationError(
            f"inference needs one column of arrays of numbers per row; got Arrow type "
            f"{array.type} (turn ML vectors into arrays with "
            f"pyspark.ml.functions.vector_to_array)"
        )
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise ConfigurationError(
            f"the features of a row are null ({array.null_count} null rows in this batch, the "
            f"first at row {row} of the batch); drop or fill them before predicting"
        )
    offsets = array.offsets.to_numpy()
    lengths = np.diff(offsets)
    width = int(lengths[0])
    if (lengths != width).any():
        other = int(lengths[lengths != width][0])
        raise ConfigurationError(
            f"features of inconsistent length: rows of {width} and of {other} values in one "
            f"batch; every row must have as many features as the model takes"
        )
    values = array.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(array), width)


def forward(spec: ModelSpec, model: Any, device: str, features: np.ndarray) -> np.ndarray:
    """The model's outputs for ``features`` as a 2-D float array, ``batch_size`` rows a pass."""
    import torch

    rows = features.shape[0]
    if features.dtype != np.float32 or not features.flags.writeable:
        # torch wants writable memory; Arrow's zero-copy views are read-only.
        features = features.astype(np.float32)
    shape = (-1, *spec.input_shape) if spec.input_shape else (rows, -1)
    outputs = []
    with torch.inference_mode():
        for start in range(0, rows, spec.batch_size):
            chunk = torch.from_numpy(features[start : start + spec.batch_size]).to(device)
            out = model(chunk.reshape(shape) if spec.input_shape else chunk)
            outputs.append(out.reshape(out.shape[0], -1).float().cpu().numpy())
    if not outputs:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(outputs)


def _list_array(matrix: np.ndarray, value_type: pa.DataType) -> pa.Array:
    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, (rows + 1) * width, width, dtype=np.int32) if rows else [0])
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel(), type=value_type))


def to_arrow(spec: ModelSpec, outputs: np.ndarray, rows: int) -> pa.Array:
    """The UDF's result for one batch, as the Arrow type of :func:`return_type`."""
    if spec.task == "raw":
        if rows == 0:
            return pa.array([], type=pa.list_(pa.float32()))
        return _list_array(outputs.astype(np.float32), pa.float32())
    if spec.task == "regression":
        if rows and outputs.shape[1] != 1:
            raise ConfigurationError(
                f"task='regression' needs one output per row, but the model gives "
                f"{outputs.shape[1]}; use task='classification' or 'raw'"
            )
        return pa.array(outputs.reshape(rows).astype(np.float64), type=pa.float64())
    if rows == 0:
        probabilities = np.zeros((0, 0))
        prediction = np.zeros(0)
    else:
        logits = outputs.astype(np.float64)
        if spec.log_probabilities:
            probabilities = np.exp(logits)
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        prediction = probabilities.argmax(axis=1).astype(np.float64)
    probability = (
        _list_array(probabilities, pa.float64())
        if rows
        else pa.array([], type=pa.list_(pa.float64()))
    )
    return pa.StructArray.from_arrays(
        [pa.array(prediction, type=pa.float64()), probability],
        names=["prediction", "probability"],
    )


def return_type(task: str) -> str:
    """The Spark SQL type (DDL) of the UDF's result for ``task``."""
    return {
        "raw": "array<float>",
        "regression": "double",
        "classification": "struct<prediction: double, probability: array<double>>",
    }[task]


def predict_arrow(spec: ModelSpec, batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
    """The body of the Arrow iterator UDF: one result array per input batch."""
    model, device = load_model(spec)
    for batch in batches:
        features = features_matrix(batch)
        yield to_arrow(spec, forward(spec, model, device, features), len(batch))
