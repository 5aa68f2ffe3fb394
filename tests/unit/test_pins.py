"""The pinned environment is one pyspark supports without warnings a user would wonder about."""

from __future__ import annotations

import warnings

import pytest


def test_pyspark_accepts_the_pinned_pandas_without_a_warning() -> None:
    """pyspark 4.3 warns (a FutureWarning on every Arrow operation) with pandas >= 3."""
    utils = pytest.importorskip("pyspark.sql.pandas.utils")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        utils.require_minimum_pandas_version()
        utils.require_minimum_pyarrow_version()
    assert [str(w.message) for w in caught] == []
