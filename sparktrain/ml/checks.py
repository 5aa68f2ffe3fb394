"""Checks made on the driver before ``fit`` starts any training: settings, columns, data, model.

Each error says what is wrong and which setting or step fixes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparktrain.errors import ConfigurationError
from sparktrain.inference.udf import build_model
from sparktrain.ml.params import BACKENDS, DATA_SOURCES, LOSSES, TASKS
from sparktrain.shipping.payload import dump_call

_NUMBERS = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")
_INTEGERS = ("ByteType", "ShortType", "IntegerType", "LongType")


@dataclasses.dataclass(frozen=True)
class DataFacts:
    """What one aggregation over the DataFrame found.

    Attributes:
        rows: number of rows.
        feature_size: values per row in the features column.
        num_classes: for classification, the highest label + 1; else 0.
    """

    rows: int
    feature_size: int
    num_classes: int


def check_settings(params: Any) -> None:
    """Settings that need no data: types and ranges, and that the functions pickle."""
    get = params.getOrDefault
    factory = get(params.modelFactory)
    if factory is None or not callable(factory):
        raise ConfigurationError(
            "TorchEstimator needs modelFactory=, a function of no arguments that builds the "
            f"torch.nn.Module; got {factory!r}"
        )
    loss = get(params.loss)
    if not callable(loss) and loss not in LOSSES:
        raise ConfigurationError(
            f"loss must be one of {', '.join(LOSSES)} or a function (output, label) -> "
            f"tensor; got {loss!r}"
        )
    task = get(params.task)
    if task not in TASKS:
        raise ConfigurationError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
    if callable(loss) and task == "auto":
        raise ConfigurationError(
            "with a loss function of your own, set task='classification' or "
            "task='regression' so that transform knows which columns to add"
        )
    optimizer = get(params.optimizerFactory)
    if optimizer is not None and not callable(optimizer):
        raise ConfigurationError(
            f"optimizerFactory must be a function (parameters) -> torch.optim.Optimizer; "
            f"got {optimizer!r}"
        )
    if get(params.backend) not in BACKENDS:
        raise ConfigurationError(
            f"backend must be one of {', '.join(BACKENDS)}; got {get(params.backend)!r}"
        )
    if get(params.dataSource) not in DATA_SOURCES:
        raise ConfigurationError(
            f"dataSource must be one of {', '.join(DATA_SOURCES)}; got {get(params.dataSource)!r}"
        )
    for name in ("batchSize", "epochs", "inferenceBatchSize"):
        if get(params.getParam(name)) < 1:
            raise ConfigurationError(f"{name} must be >= 1; got {get(params.getParam(name))}")
    if get(params.np) == 0:
        raise ConfigurationError("np must not be 0: > 0 runs on executors, < 0 on the driver")
    if get(params.maxRestarts) < 0:
        raise ConfigurationError(f"maxRestarts must be >= 0; got {get(params.maxRestarts)}")
    fraction = get(params.validationFraction)
    if not 0.0 <= fraction < 1.0:
        raise ConfigurationError(f"validationFraction must be in [0, 1); got {fraction}")
    # Names the captured object that cannot cross to the ranks (a lock, a SparkSession).
    dump_call(factory, (), {}, 1 << 62)
    if callable(loss):
        dump_call(loss, (), {}, 1 << 62)
    if optimizer is not None:
        dump_call(optimizer, (), {}, 1 << 62)


def _field(df: Any, name: str, role: str, setting: str) -> Any:
    names = [field.name for field in df.schema.fields]
    if name not in names:
        raise ConfigurationError(
            f"the {role} column {name!r} is not in the DataFrame (its columns: "
            f"{', '.join(names)}); set {setting}= to one of them"
        )
    return df.schema[name]


def features_expression(df: Any, name: str) -> Any:
    """The features column as ``array<float>``, or a clear error for another type."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions, types

    field = _field(df, name, "features", "featuresCol")
    data_type = field.dataType
    column = functions.col(f"`{name}`")
    if type(data_type).__name__ == "VectorUDT":
        return vector_to_array(column, "float32")
    if isinstance(data_type, types.ArrayType) and type(data_type.elementType).__name__ in _NUMBERS:
        return column.cast("array<float>")
    raise ConfigurationError(
        f"the features column {name!r} is {data_type.simpleString()}; it must be an ML vector "
        f"or an array of numbers (put number columns together with "
        f"pyspark.ml.feature.VectorAssembler)"
    )


def label_type(df: Any, name: str, task: str) -> str:
    """The Spark type the label is cast to for training, or a clear error."""
    field = _field(df, name, "label", "labelCol")
    type_name = type(field.dataType).__name__
    if type_name not in _NUMBERS:
        raise ConfigurationError(
            f"the label column {name!r} is {field.dataType.simpleString()}; it must be a number "
            f"(index string labels with pyspark.ml.feature.StringIndexer)"
        )
    return "long" if task == "classification" else "float"


def check_data(df: Any, features: Any, label: str, task: str) -> DataFacts:
    """One aggregation job: row count, feature lengths, nulls and label range."""
    from pyspark.sql import functions as F

    size = F.size(features)
    label_col = F.col(f"`{label}`")
    row = df.select(
        F.count(F.lit(1)).alias("rows"),
        F.min(size).alias("shortest"),
        F.max(size).alias("longest"),
        F.sum(F.when(features.isNull(), 1).otherwise(0)).alias("null_features"),
        F.sum(F.when(label_col.isNull(), 1).otherwise(0)).alias("null_labels"),
        F.min(label_col).alias("min_label"),
        F.max(label_col).alias("max_label"),
        F.sum(F.when(label_col != F.floor(label_col), 1).otherwise(0)).alias("fractional"),
    ).first()
    if row is None or row["rows"] == 0:
        raise ConfigurationError(
            "the DataFrame is empty (0 rows), so there is nothing to train on; check the "
            "filters or joins that produce it"
        )
    if row["null_features"] or row["null_labels"]:
        raise ConfigurationError(
            f"{row['null_features']} row(s) have null features and {row['null_labels']} a null "
            f"label; drop or fill them (df.dropna()) before fit"
        )
    if row["shortest"] != row["longest"]:
        raise ConfigurationError(
            f"features of inconsistent length: rows have from {row['shortest']} to "
            f"{row['longest']} values; every row needs the same number of features"
        )
    num_classes = 0
    if task == "classification":
        if row["min_label"] < 0 or row["fractional"]:
            raise ConfigurationError(
                f"classification needs labels 0, 1, 2, ...; found labels from "
                f"{row['min_label']} to {row['max_label']}"
                + (f" and {row['fractional']} that are not whole" if row["fractional"] else "")
                + " (index them with pyspark.ml.feature.StringIndexer, or set task='regression')"
            )
        num_classes = int(row["max_label"]) + 1
    return DataFacts(rows=row["rows"], feature_size=row["longest"], num_classes=num_classes)


def check_model(params: Any, facts: DataFacts, task: str) -> None:
    """Build the model on the driver and run two rows of zeros through it."""
    import torch

    model = build_model(params.getOrDefault(params.modelFactory))
    shape = params.getInputShape()
    if shape is not None and _product(shape) != facts.feature_size:
        raise ConfigurationError(
            f"inputShape {shape} holds {_product(shape)} values, but each row has "
            f"{facts.feature_size} features"
        )
    optimizer = params.getOrDefault(params.optimizerFactory)
    if optimizer is not None:
        made = optimizer(model.parameters())
        if not isinstance(made, torch.optim.Optimizer):
            raise ConfigurationError(
                f"optimizerFactory must return a torch.optim.Optimizer; it returned "
                f"{type(made).__name__}"
            )
    example = torch.zeros(2, *(shape or [facts.feature_size]))
    try:
        with torch.no_grad():
            output = model.eval()(example)
    except Exception as exc:
        raise ConfigurationError(
            f"the model fails on a batch of shape {tuple(example.shape)} "
            f"({type(exc).__name__}: {exc}); each row has {facts.feature_size} features: fix "
            f"the model's input size, or set inputShape= to the shape it takes"
        ) from exc
    per_row = output.reshape(2, -1).shape[1]
    if task == "classification" and per_row < facts.num_classes:
        raise ConfigurationError(
            f"the model gives {per_row} outputs per row, but the labels go up to "
            f"{facts.num_classes - 1}: a classifier needs one output per class"
        )
    if task == "regression" and per_row != 1:
        raise ConfigurationError(
            f"the model gives {per_row} outputs per row; regression needs one (or set "
            f"task='classification')"
        )


def _product(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total
