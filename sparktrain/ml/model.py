"""TorchModel: a fitted torch model as a Spark ML Transformer, saved with its weights."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
from pyspark.ml import Model
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparktrain.errors import ConfigurationError
from sparktrain.inference.predictor import ModelSpec
from sparktrain.inference.udf import model_spec, spark_udf
from sparktrain.ml.checks import features_expression
from sparktrain.ml.params import ModelParams

_MODEL_DIR = "model"
_FORMAT = 1


class TorchModel(Model, ModelParams, MLWritable, MLReadable["TorchModel"]):
    """A trained torch model that adds predictions to a DataFrame, in batches on the executors.

    Made by :meth:`TorchEstimator.fit <sparktrain.ml.TorchEstimator.fit>`, or loaded with
    ``TorchModel.load(path)`` (also inside a saved ``PipelineModel``). ``transform`` adds
    ``predictionCol`` (a double: the class index, or the regression value) and, for
    classifiers, ``probabilityCol`` (an ML vector); set either to ``""`` to leave it out.

    Loading a saved model unpickles its model factory: load only models you trust, as with
    ``torch.load(weights_only=False)``.

    Attributes:
        history: one dict per epoch (``epoch``, ``loss``, ``val_loss``, ``val_accuracy``).

    Example:
        >>> model = TorchEstimator(modelFactory=build, np=2).fit(train_df)
        >>> model.transform(test_df).select("prediction", "probability").show()
        >>> model.write().overwrite().save("/models/digits")
        >>> TorchModel.load("/models/digits").transform(test_df)
    """

    def __init__(
        self,
        model_factory: Callable[[], Any] | None = None,
        state: Mapping[str, Any] | None = None,
        history: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.model_factory = model_factory
        self.state = dict(state) if state is not None else None
        self.history = list(history or [])
        self._spec: tuple[tuple[Any, ...], ModelSpec] | None = None

    def setFeaturesCol(self, value: str) -> TorchModel:
        """Set the features column (an ML vector or an array of numbers)."""
        return self._set(featuresCol=value)

    def setPredictionCol(self, value: str) -> TorchModel:
        """Set the prediction column (``""``: leave it out)."""
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> TorchModel:
        """Set the probability column of a classifier (``""``: leave it out)."""
        return self._set(probabilityCol=value)

    def setInferenceBatchSize(self, value: int) -> TorchModel:
        """Set the rows per forward pass."""
        return self._set(inferenceBatchSize=value)

    def torch_model(self) -> Any:
        """The ``torch.nn.Module`` with the trained weights, on the CPU."""
        if self.model_factory is None:
            raise ConfigurationError("this TorchModel has no model; fit or load one")
        model = self.model_factory()
        if self.state is not None:
            model.load_state_dict(self.state)
        return model.eval()

    def _model_spec(self) -> ModelSpec:
        """The inference spec for the current settings (checked and pickled once per setting)."""
        settings = (
            self.getOrDefault(self.task),
            self.getInferenceBatchSize(),
            tuple(self.getInputShape() or ()),
            self.getDevice(),
            self.getOrDefault(self.logProbabilities),
        )
        if self._spec is None or self._spec[0] != settings:
            if self.model_factory is None:
                raise ConfigurationError("this TorchModel has no model; fit or load one")
            task, batch_size, shape, device, log_probabilities = settings
            spec = model_spec(
                self.model_factory,
                state=self.state,
                task=task if task == "classification" else "regression",
                batch_size=batch_size,
                input_shape=shape or None,
                device=device,
                log_probabilities=log_probabilities,
            )
            self._spec = (settings, spec)
        return self._spec[1]

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import array_to_vector

        features = features_expression(dataset, self.getFeaturesCol())
        udf = spark_udf(self._model_spec())
        prediction, probability = self.getPredictionCol(), self.getProbabilityCol()
        if self.getOrDefault(self.task) != "classification":
            return dataset.withColumn(prediction, udf(features)) if prediction else dataset
        if not prediction and not probability:
            return dataset
        scratch = "_sparktrain_output_" + self.uid
        # One UDF evaluation per row, then the struct's fields become the two columns.
        out = dataset.withColumn(scratch, udf(features))
        if prediction:
            out = out.withColumn(prediction, out[scratch]["prediction"])
        if probability:
            out = out.withColumn(probability, array_to_vector(out[scratch]["probability"]))
        return out.drop(scratch)

    def copy(self, extra: dict[Any, Any] | None = None) -> TorchModel:
        """A copy with the same model and weights, and ``extra`` params."""
        copied = super().copy(extra)
        copied._spec = None
        return copied

    def write(self) -> MLWriter:
        """A writer that saves the params (as Spark ML metadata) and the pickled model."""
        return _TorchModelWriter(self)

    @classmethod
    def read(cls) -> MLReader[TorchModel]:
        """A reader for :meth:`write`'s output."""
        return _TorchModelReader(cls)


class _TorchModelWriter(MLWriter):
    def __init__(self, instance: TorchModel) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Save to ``path``; with ``overwrite()``, what is there is removed first.

        From a Spark Connect session the server removes it (pyspark's own overwrite reaches
        for the JVM, which a Connect client does not have).
        """
        from sparktrain.driver.places import is_connect

        if not (self.shouldOverwrite and is_connect(self.sparkSession)):
            super().save(path)
            return
        try:
            from pyspark.ml.connect.readwrite import RemoteMLWriter
        except ImportError as exc:  # pyspark 3.5: no Spark ML over Connect
            raise ConfigurationError(
                f"overwrite() from a Spark Connect session needs pyspark 4.0 or later (this "
                f"client has an older one); remove {path} first, or save without overwrite()"
            ) from exc
        RemoteMLWriter.handleOverwrite(path, True)
        self.saveImpl(path)

    def saveImpl(self, path: str) -> None:
        if self.instance.model_factory is None:
            raise ConfigurationError("this TorchModel has no model to save; fit or load one")
        extra = {"format": _FORMAT, "history": self.instance.history}
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, extraMetadata=extra
        )
        data = cloudpickle.dumps((self.instance.model_factory, self.instance.state))
        # Written by Spark, so any storage Spark writes to (HDFS, S3A, DBFS) holds the weights.
        frame = self.sparkSession.createDataFrame([(bytearray(data),)], "model binary")
        frame.coalesce(1).write.parquet(posixpath.join(path, _MODEL_DIR))


class _TorchModelReader(MLReader[TorchModel]):
    def __init__(self, cls: type[TorchModel]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> TorchModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        if metadata.get("format") != _FORMAT:
            raise ConfigurationError(
                f"{path} was not saved by TorchModel.write() (format {metadata.get('format')!r})"
            )
        rows = self.sparkSession.read.parquet(posixpath.join(path, _MODEL_DIR)).collect()
        model_factory, state = cloudpickle.loads(bytes(rows[0]["model"]))
        instance = self.cls(model_factory, state, metadata.get("history"))
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance
