"""The checkpoint errors and warning; public through :mod:`sparktrain.checkpoint`."""

from __future__ import annotations

from sparktrain.errors import ConfigurationError, SparkTrainError

# Each class names the public module, so tracebacks and pickles use that path.


class CheckpointError(SparkTrainError):
    """A checkpoint passed its integrity check but could not be loaded."""

    __module__ = "sparktrain.checkpoint"


class CheckpointOwnershipError(ConfigurationError):
    """Another run writes checkpoints into the same directory."""

    __module__ = "sparktrain.checkpoint"


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (uncommitted, missing, truncated or corrupted)."""

    __module__ = "sparktrain.checkpoint"
