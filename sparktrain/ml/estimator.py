"""TorchEstimator: train a torch model on a Spark DataFrame with SparkRunner, as a Spark ML stage."""

from __future__ import annotations

import warnings
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator

from sparktrain.errors import ConfigurationError
from sparktrain.ml.checks import (
    check_data,
    check_model,
    check_settings,
    features_expression,
    label_type,
)
from sparktrain.ml.model import TorchModel
from sparktrain.ml.params import EstimatorParams
from sparktrain.ml.train import FEATURES, LABEL, TrainJob, train_on_rank


class TorchEstimator(Estimator[TorchModel], EstimatorParams):
    """A Spark ML Estimator that trains a torch model on ``np`` ranks with :class:`SparkRunner`.

    ``fit(df)`` checks the settings, the columns, the data (one aggregation job: rows,
    feature lengths, nulls, labels) and the model (built on the driver, two rows of zeros
    through it) before any training starts; materializes the rows once as Parquet with
    :func:`sparktrain.data.make_spark_converter`; trains with DDP (``backend="torch"``) or
    Horovod on Spark barrier tasks (``np > 0``) or on the driver (``np < 0``), reporting each
    epoch's loss (and, with ``validationFraction``, validation loss and accuracy) to the
    progress bar; and returns a :class:`TorchModel` with the weights and the history.

    Every argument is a Param of the same name (``est.getOrDefault("epochs")``, ``copy``,
    ``setParams``).

    Args:
        modelFactory: a function of no arguments that builds the ``torch.nn.Module``.
        loss: ``"cross_entropy"`` (default), ``"nll"``, ``"mse"``, ``"l1"``, ``"smooth_l1"``,
            or a function ``(output, label) -> tensor`` (then set ``task``).
        optimizerFactory: ``(parameters) -> torch.optim.Optimizer``; default
            ``Adam(parameters, lr=learningRate)``.
        learningRate: the default optimizer's learning rate (1e-3).
        featuresCol: an ML vector or array-of-numbers column (default ``"features"``).
        labelCol: a number column (default ``"label"``); class indices for classifiers.
        predictionCol: the column of predictions the fitted model adds.
        probabilityCol: the column of class probabilities the fitted model adds.
        batchSize: training rows per batch on each rank (64).
        epochs: passes over the data (10).
        np: ranks: > 0 on Spark executors, < 0 on the driver (2).
        backend: ``"torch"`` (DDP, default) or ``"horovod"``.
        checkpointDir: where a checkpoint is saved each epoch; a restarted or repeated fit
            resumes from the newest one.
        maxRestarts: launches after a lost rank or executor (0).
        validationFraction: rows held out for validation metrics each epoch (0: none).
        task: ``"auto"`` (classification for cross_entropy and nll), ``"classification"``
            or ``"regression"``.
        inputShape: one row's shape for the model, e.g. ``[1, 8, 8]`` (default: flat).
        inferenceBatchSize: rows per forward pass in ``transform`` (1024).
        device: inference device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        seed: seeds initialization, shuffling and the validation split (0).
        dataSource: how the training rows reach the ranks: ``"cache"`` (the default: a
            Parquet copy through ``make_spark_converter``, shuffled across all rows) or
            ``"stream"`` (no copy: the fit's stage runs over the DataFrame and each task
            streams its partition, shuffled within each rank's share; see
            :func:`sparktrain.data.from_dataframe`). Held-out validation rows use a cache.

    Raises:
        ConfigurationError: from ``fit``, before training, for a missing or mistyped column,
            an empty DataFrame, features of inconsistent length, a model that does not fit
            the data, or an invalid setting.
        PayloadError: from ``fit``, when the model factory (or loss, optimizer factory)
            cannot be pickled; the captured object is named.

    Example:
        >>> from pyspark.ml import Pipeline
        >>> from pyspark.ml.feature import VectorAssembler
        >>> assembler = VectorAssembler(inputCols=pixel_columns, outputCol="features")
        >>> estimator = TorchEstimator(modelFactory=build_net, np=2, epochs=5)
        >>> model = Pipeline(stages=[assembler, estimator]).fit(train_df)
        >>> model.transform(test_df).select("label", "prediction").show()
    """

    @keyword_only
    def __init__(
        self,
        *,
        modelFactory: Any = None,
        loss: Any = "cross_entropy",
        optimizerFactory: Any = None,
        learningRate: float = 1e-3,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        batchSize: int = 64,
        epochs: int = 10,
        np: int = 2,
        backend: str = "torch",
        checkpointDir: str | None = None,
        maxRestarts: int = 0,
        validationFraction: float = 0.0,
        dataSource: str = "cache",
        task: str = "auto",
        inputShape: list[int] | None = None,
        inferenceBatchSize: int = 1024,
        device: str = "auto",
        seed: int = 0,
    ) -> None:
        super().__init__()
        self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(
        self,
        *,
        modelFactory: Any = None,
        loss: Any = "cross_entropy",
        optimizerFactory: Any = None,
        learningRate: float = 1e-3,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        batchSize: int = 64,
        epochs: int = 10,
        np: int = 2,
        backend: str = "torch",
        checkpointDir: str | None = None,
        maxRestarts: int = 0,
        validationFraction: float = 0.0,
        dataSource: str = "cache",
        task: str = "auto",
        inputShape: list[int] | None = None,
        inferenceBatchSize: int = 1024,
        device: str = "auto",
        seed: int = 0,
    ) -> TorchEstimator:
        """Set the Params given by keyword (the others keep their values)."""
        return self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    def _fit(self, dataset: Any) -> TorchModel:
        get = self.getOrDefault
        check_settings(self)
        task = self.resolved_task()
        features = features_expression(dataset, self.getFeaturesCol())
        label = self.getLabelCol()
        cast = label_type(dataset, label, task)
        facts = check_data(dataset, features, label, task)
        check_model(self, facts, task)
        rows = dataset.select(
            features.alias(FEATURES), dataset[f"`{label}`"].cast(cast).alias(LABEL)
        )
        history, state = self._train(rows, task)
        model = TorchModel(get(self.modelFactory), state, history)
        model._set(
            featuresCol=self.getFeaturesCol(),
            predictionCol=self.getPredictionCol(),
            probabilityCol=self.getProbabilityCol(),
            inputShape=self.getInputShape(),
            inferenceBatchSize=self.getInferenceBatchSize(),
            device=self.getDevice(),
            task=task,
            logProbabilities=get(self.loss) == "nll",
        )
        return model

    def _train(self, rows: Any, task: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Materialize ``rows``, run the training on the ranks; rank 0's history and weights."""
        from sparktrain.data import make_spark_converter
        from sparktrain.runner import SparkRunner

        get = self.getOrDefault
        fraction, seed = get(self.validationFraction), get(self.seed)
        train_rows, validation_rows = rows, None
        if fraction > 0:
            train_rows, validation_rows = rows.randomSplit([1.0 - fraction, fraction], seed)
        train: Any
        if get(self.dataSource) == "stream":
            from sparktrain.data import from_dataframe

            train = from_dataframe(
                train_rows,
                get(self.batchSize),
                num_epochs=get(self.epochs),
                shuffle=True,
                seed=seed,
            )
        else:
            train = make_spark_converter(train_rows)
        validation = None
        try:
            if validation_rows is not None:
                try:
                    validation = make_spark_converter(validation_rows)
                except ConfigurationError:
                    warnings.warn(
                        f"validationFraction={fraction} held out no rows; no validation "
                        f"metrics are reported",
                        UserWarning,
                        stacklevel=4,
                    )
            job = TrainJob(
                model_factory=get(self.modelFactory),
                loss=get(self.loss),
                optimizer_factory=get(self.optimizerFactory),
                learning_rate=get(self.learningRate),
                train=train,
                validation=validation,
                batch_size=get(self.batchSize),
                epochs=get(self.epochs),
                backend=get(self.backend),
                task=task,
                input_shape=tuple(self.getInputShape() or ()) or None,
                checkpoint_dir=get(self.checkpointDir),
                seed=seed,
            )
            runner = SparkRunner(
                get(self.np),
                backend=get(self.backend),
                spark=rows.sparkSession,
                total_epochs=get(self.epochs),
                checkpoint_dir=get(self.checkpointDir),
                max_restarts=get(self.maxRestarts),
            )
            # A stream's description goes as an argument of its own: the runner finds it
            # among the arguments, and runs the stage over its DataFrame.
            streamed = {"data": train} if get(self.dataSource) == "stream" else {}
            result = runner.run(train_on_rank, job, **streamed)
        finally:
            if hasattr(train, "delete"):
                train.delete()
            if validation is not None:
                validation.delete()
        return result["history"], result["state"]
