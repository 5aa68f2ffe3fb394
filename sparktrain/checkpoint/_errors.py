"""The checkpoint errors and warning; public through :mod:`sparktrain.checkpoint`."""

from __future__ import annotations

import os
import sys
import warnings

from sparktrain.errors import ConfigurationError, SparkTrainError

_PACKAGE = os.path.dirname(os.path.abspath(__file__))

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


def warn(message: str) -> None:
    """Warn with :class:`CheckpointWarning` at the user's line: the first caller outside this
    package (``save``, ``load_latest`` or a background save reach it by different paths)."""
    frame = sys._getframe(1)
    level = 2  # warn's caller
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == _PACKAGE:
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, CheckpointWarning, stacklevel=level)
