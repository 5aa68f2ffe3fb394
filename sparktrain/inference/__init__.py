"""Batched inference on Spark executors for torch models, however they were trained.

Example:
    >>> from pyspark.ml.functions import vector_to_array
    >>> from sparktrain.inference import predict_udf
    >>> classify = predict_udf(model, task="classification", batch_size=512)
    >>> df.withColumn("out", classify(vector_to_array("features"))).select("out.prediction")

The driver side (:func:`predict_udf`) imports pyspark only when called; the executor side
(:mod:`sparktrain.inference.predictor`) builds the model once per Python worker.
"""

from sparktrain.inference.udf import predict_udf

__all__ = ["predict_udf"]
