"""Driver side of batched inference: check the model, pickle it once, make the Spark UDF."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import cloudpickle
import pyarrow as pa

from sparktrain.errors import ConfigurationError, PayloadError
from sparktrain.inference.predictor import DEVICES, TASKS, ModelSpec, return_type
from sparktrain.shipping.python_probe import pin_udf


def predict_udf(
    model: Any,
    *,
    checkpoint: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    state_key: str = "model",
    task: str = "raw",
    batch_size: int = 1024,
    input_shape: tuple[int, ...] | None = None,
    device: str = "auto",
    log_probabilities: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """A Spark UDF that runs a torch model over a column of feature arrays, in batches.

    The model is pickled once on the driver. On the executors it is built once per Python
    worker and kept for the next batches and tasks (Spark reuses Python workers), moved to
    the task's GPU when Spark gave the task one, and fed ``batch_size`` rows per forward
    pass from Arrow batches (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows each),
    never row by row.

    Args:
        model: a ``torch.nn.Module`` (its weights travel with it), or a function of no
            arguments that builds one (weights from ``checkpoint``).
        checkpoint: the weights: a state_dict, or a directory of
            :mod:`sparktrain.checkpoint` checkpoints whose newest is loaded on the driver
            (its ``state[state_key]``, or the whole state when it is the state_dict).
        state_key: where the state_dict is inside a checkpoint's state.
        task: ``"raw"``: the outputs, flattened, as ``array<float>``; ``"regression"``: one
            output per row as ``double``; ``"classification"``: a struct of ``prediction``
            (the argmax, ``double``) and ``probability`` (``array<double>``, the softmax).
        batch_size: rows per forward pass (bounds the GPU memory of one pass).
        input_shape: the shape of one row's features for the model, e.g. ``(1, 8, 8)``;
            default: the flat array.
        device: ``"auto"`` (the task's GPU when it has one, else the CPU), ``"cpu"`` or
            ``"cuda"``.
        log_probabilities: the model outputs log-probabilities (trained with NLL loss), so
            ``exp`` gives the probabilities of ``task="classification"``.
        storage_options: fsspec options for reading a checkpoint URL.

    Returns:
        A UDF of one column of arrays of numbers (ML vectors: apply
        ``pyspark.ml.functions.vector_to_array`` first).

    Raises:
        ConfigurationError: an invalid option, a model that cannot be built or does not take
            the checkpoint's weights, or a checkpoint directory with no checkpoint.
        PayloadError: the model cannot be pickled.

    Example:
        >>> from pyspark.ml.functions import vector_to_array
        >>> classify = predict_udf(build_net, checkpoint="/dbfs/ckpt/run1",
        ...                        task="classification", batch_size=512)
        >>> scored = df.withColumn("out", classify(vector_to_array("features")))
        >>> scored.select("out.prediction", "out.probability")
    """
    spec = model_spec(
        model,
        state=load_weights(checkpoint, state_key, storage_options),
        task=task,
        batch_size=batch_size,
        input_shape=input_shape,
        device=device,
        log_probabilities=log_probabilities,
    )
    return spark_udf(spec)


def load_weights(
    checkpoint: str | os.PathLike[str] | Mapping[str, Any] | None,
    state_key: str,
    storage_options: Mapping[str, Any] | None,
) -> Mapping[str, Any] | None:
    """The state_dict given directly, or read from a checkpoint directory's newest checkpoint."""
    if checkpoint is None or isinstance(checkpoint, Mapping):
        return checkpoint
    from sparktrain.checkpoint import load_latest

    found = load_latest(checkpoint, map_location="cpu", storage_options=storage_options)
    if found is None:
        raise ConfigurationError(
            f"no committed checkpoint in {os.fspath(checkpoint)!s}; pass the directory that "
            f"sparktrain.checkpoint.save wrote, or the state_dict itself as checkpoint="
        )
    state = found.state
    if isinstance(state, Mapping) and state_key in state:
        return state[state_key]
    if isinstance(state, Mapping) and state and all(hasattr(v, "shape") for v in state.values()):
        return state
    keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
    raise ConfigurationError(
        f"the checkpoint {found.path} holds no {state_key!r} entry (it has {keys}); set "
        f"state_key= to the entry that holds the model's state_dict"
    )


def model_spec(
    model: Any,
    *,
    state: Mapping[str, Any] | None = None,
    task: str = "raw",
    batch_size: int = 1024,
    input_shape: tuple[int, ...] | None = None,
    device: str = "auto",
    log_probabilities: bool = False,
) -> ModelSpec:
    """Check the options and the model on the driver and pickle it for the executors."""
    import torch

    if task not in TASKS:
        raise ConfigurationError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
    if device not in DEVICES:
        raise ConfigurationError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be a positive int; got {batch_size!r}")
    if input_shape is not None:
        input_shape = tuple(input_shape)
        if not input_shape or not all(isinstance(d, int) and d > 0 for d in input_shape):
            raise ConfigurationError(
                f"input_shape must be a tuple of positive ints; got {input_shape!r}"
            )
    if isinstance(model, torch.nn.Module):
        built = model
    elif callable(model):
        built = build_model(model)
    else:
        raise ConfigurationError(
            f"model must be a torch.nn.Module or a function that builds one; got "
            f"{type(model).__name__}"
        )
    if state is not None:
        try:
            built.load_state_dict(state)
        except Exception as exc:
            raise ConfigurationError(
                f"the model does not take the checkpoint's weights ({type(exc).__name__}: "
                f"{exc}); build the same architecture that was trained"
            ) from exc
    data = pickle_model(model, state)
    return ModelSpec.build(
        data,
        task=task,
        batch_size=batch_size,
        input_shape=input_shape,
        device=device,
        log_probabilities=log_probabilities,
    )


def build_model(factory: Any) -> Any:
    """Call a model factory on the driver, with a clear error when it fails."""
    import torch

    try:
        built = factory()
    except Exception as exc:
        name = getattr(factory, "__name__", repr(factory))
        raise ConfigurationError(
            f"the model factory {name}() failed on the driver ({type(exc).__name__}: {exc}); "
            f"it must build the model with no arguments"
        ) from exc
    if not isinstance(built, torch.nn.Module):
        raise ConfigurationError(
            f"the model factory must return a torch.nn.Module; it returned {type(built).__name__}"
        )
    return built


def pickle_model(model: Any, state: Mapping[str, Any] | None) -> bytes:
    """cloudpickle of ``(model, state)``, naming what cannot be pickled."""
    try:
        return cloudpickle.dumps((model, None if state is None else dict(state)))
    except Exception as exc:
        from sparktrain.shipping.payload import dump_call

        # dump_call names the captured object that fails (a lock, a session, a client).
        if callable(model) and not hasattr(model, "state_dict"):
            dump_call(model, (), {}, 1 << 62)
        raise PayloadError(
            f"the model cannot be pickled for the executors ({type(exc).__name__}: {exc}); "
            f"keep locks, clients and Spark objects out of it, or pass a function that builds "
            f"it"
        ) from exc


def spark_udf(spec: ModelSpec) -> Any:
    """The Spark UDF of ``spec``: an Arrow iterator UDF (pandas on PySpark before 4.1), that
    starts the executors' Python a run would start (see
    :func:`~sparktrain.shipping.python_probe.pin_udf`)."""
    ddl = return_type(spec.task)
    try:
        from pyspark.sql.functions import arrow_udf
    except ImportError:
        return pin_udf(_pandas_udf(spec, ddl))

    # The type hints tell PySpark this is an iterator UDF (one call per task, many batches).
    def predict(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        from sparktrain.inference.predictor import predict_arrow

        yield from predict_arrow(spec, batches)

    return pin_udf(arrow_udf(predict, ddl))  # type: ignore[call-overload]


def _pandas_udf(spec: ModelSpec, ddl: str) -> Any:
    """The same UDF over pandas, for PySpark versions without Arrow UDFs."""
    from pyspark.sql.functions import PandasUDFType, pandas_udf

    return pandas_udf(pandas_predict(spec), ddl, PandasUDFType.SCALAR_ITER)


def pandas_predict(spec: ModelSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The body of the pandas iterator UDF: Series of arrays in, Series or DataFrames out."""

    def predict(batches: Iterator[Any]) -> Iterator[Any]:
        from sparktrain.inference.predictor import predict_arrow

        arrays = (pa.array(series, type=pa.list_(pa.float32())) for series in batches)
        for result in predict_arrow(spec, arrays):
            if isinstance(result, pa.StructArray):
                yield pa.Table.from_arrays(
                    result.flatten(), names=["prediction", "probability"]
                ).to_pandas()
            else:
                yield result.to_pandas()

    return predict
