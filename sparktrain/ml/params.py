"""The Params of :class:`TorchEstimator` and :class:`TorchModel`, as pyspark.ml mixins."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasSeed,
)

# Losses by name, and whether each one makes a classifier.
CLASSIFICATION_LOSSES = ("cross_entropy", "nll")
REGRESSION_LOSSES = ("mse", "l1", "smooth_l1")
LOSSES = CLASSIFICATION_LOSSES + REGRESSION_LOSSES
TASKS = ("auto", "classification", "regression")
BACKENDS = ("torch", "horovod")
DATA_SOURCES = ("cache", "stream")


def _shape(value: Any) -> list[int] | None:
    if value is None:
        return None
    return TypeConverters.toListInt(value)


def _optional_string(value: Any) -> str | None:
    return None if value is None else TypeConverters.toString(value)


class HasInferenceParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol):
    """What inference needs: the columns, the shape of a row, the batch size and device."""

    inputShape: Param[list[int] | None] = Param(
        Params._dummy(),
        "inputShape",
        "shape of one row's features for the model, e.g. [1, 8, 8]; empty: the flat array",
        typeConverter=_shape,
    )
    inferenceBatchSize: Param[int] = Param(
        Params._dummy(),
        "inferenceBatchSize",
        "rows per forward pass when transforming",
        typeConverter=TypeConverters.toInt,
    )
    device: Param[str] = Param(
        Params._dummy(),
        "device",
        "inference device: auto (the task's GPU when it has one), cpu or cuda",
        typeConverter=TypeConverters.toString,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inputShape=None, inferenceBatchSize=1024, device="auto")

    def getInputShape(self) -> list[int] | None:
        """The shape of one row's features given to the model (None: flat)."""
        return self.getOrDefault(self.inputShape)

    def getInferenceBatchSize(self) -> int:
        """Rows per forward pass when transforming."""
        return self.getOrDefault(self.inferenceBatchSize)

    def getDevice(self) -> str:
        """The inference device setting."""
        return self.getOrDefault(self.device)


class EstimatorParams(HasInferenceParams, HasLabelCol, HasSeed):
    """Every setting of :class:`~sparktrain.ml.TorchEstimator`."""

    modelFactory: Param[Any] = Param(
        Params._dummy(),
        "modelFactory",
        "function of no arguments that builds the torch.nn.Module",
        typeConverter=TypeConverters.identity,
    )
    loss: Param[Any] = Param(
        Params._dummy(),
        "loss",
        f"loss: one of {', '.join(LOSSES)}, or a function (output, label) -> scalar tensor",
        typeConverter=TypeConverters.identity,
    )
    optimizerFactory: Param[Any] = Param(
        Params._dummy(),
        "optimizerFactory",
        "function (parameters) -> torch.optim.Optimizer; default Adam(learningRate)",
        typeConverter=TypeConverters.identity,
    )
    learningRate: Param[float] = Param(
        Params._dummy(),
        "learningRate",
        "learning rate of the default optimizer (Adam)",
        typeConverter=TypeConverters.toFloat,
    )
    batchSize: Param[int] = Param(
        Params._dummy(),
        "batchSize",
        "training rows per batch on each rank",
        typeConverter=TypeConverters.toInt,
    )
    epochs: Param[int] = Param(
        Params._dummy(), "epochs", "passes over the training data", TypeConverters.toInt
    )
    np: Param[int] = Param(
        Params._dummy(),
        "np",
        "number of ranks: > 0 on Spark executors, < 0 on the driver",
        typeConverter=TypeConverters.toInt,
    )
    backend: Param[str] = Param(
        Params._dummy(),
        "backend",
        f"how ranks train together: {' or '.join(BACKENDS)}",
        typeConverter=TypeConverters.toString,
    )
    checkpointDir: Param[str | None] = Param(
        Params._dummy(),
        "checkpointDir",
        "where rank 0 saves a checkpoint each epoch (any fsspec URL); restarts resume from it",
        typeConverter=_optional_string,
    )
    maxRestarts: Param[int] = Param(
        Params._dummy(),
        "maxRestarts",
        "launches after a lost rank or executor (resuming from checkpointDir)",
        typeConverter=TypeConverters.toInt,
    )
    dataSource: Param[str] = Param(
        Params._dummy(),
        "dataSource",
        "how the training rows reach the ranks: cache (a Parquet copy, make_spark_converter) "
        "or stream (each task streams its partition, no copy: sparktrain.data.from_dataframe)",
        typeConverter=TypeConverters.toString,
    )
    validationFraction: Param[float] = Param(
        Params._dummy(),
        "validationFraction",
        "fraction of rows held out to report validation loss (and accuracy) each epoch",
        typeConverter=TypeConverters.toFloat,
    )
    task: Param[str] = Param(
        Params._dummy(),
        "task",
        f"{', '.join(TASKS)}: auto follows the loss (cross_entropy, nll: classification)",
        typeConverter=TypeConverters.toString,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            featuresCol="features",
            labelCol="label",
            predictionCol="prediction",
            probabilityCol="probability",
            modelFactory=None,
            loss="cross_entropy",
            optimizerFactory=None,
            learningRate=1e-3,
            batchSize=64,
            epochs=10,
            np=2,
            backend="torch",
            checkpointDir=None,
            maxRestarts=0,
            validationFraction=0.0,
            dataSource="cache",
            task="auto",
            seed=0,
        )

    def resolved_task(self) -> str:
        """``classification`` or ``regression``: the task, or what the named loss implies."""
        task = self.getOrDefault(self.task)
        if task != "auto":
            return task
        loss = self.getOrDefault(self.loss)
        return "classification" if loss in CLASSIFICATION_LOSSES else "regression"


class ModelParams(HasInferenceParams):
    """The settings of :class:`~sparktrain.ml.TorchModel`."""

    task: Param[str] = Param(
        Params._dummy(),
        "task",
        "classification (prediction and probability columns) or regression (prediction)",
        typeConverter=TypeConverters.toString,
    )
    logProbabilities: Param[bool] = Param(
        Params._dummy(),
        "logProbabilities",
        "the model outputs log-probabilities (NLL loss): exp, not softmax, gives probability",
        typeConverter=TypeConverters.toBoolean,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            featuresCol="features",
            predictionCol="prediction",
            probabilityCol="probability",
            task="regression",
            logProbabilities=False,
        )
