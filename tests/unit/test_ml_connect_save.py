"""TorchModel.write().overwrite() from a Spark Connect client whose pyspark has no Spark ML
over Connect (before 4.0): refused with the way out, before anything is removed or written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sparktrain import ConfigurationError
from tests.fixtures.ml_models import digits_mlp

pytest.importorskip("pyspark")


class _ConnectSession:
    """Stands in for a Connect client session: only its type's module is looked at first."""


_ConnectSession.__module__ = "pyspark.sql.connect.session"


def test_overwrite_without_ml_over_connect_names_the_way_out(tmp_path: Path, monkeypatch):
    from sparktrain.ml import TorchModel

    saved = tmp_path / "model"
    saved.mkdir()
    (saved / "kept").write_text("an earlier save")
    # What an older pyspark lacks: the module that overwrites through the Connect server.
    monkeypatch.setitem(sys.modules, "pyspark.ml.connect.readwrite", None)
    writer = TorchModel(digits_mlp).write().overwrite()
    writer.session(_ConnectSession())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as info:
        writer.save(str(saved))
    message = str(info.value)
    assert "overwrite() from a Spark Connect session needs pyspark 4.0 or later" in message
    assert f"remove {saved} first, or save without overwrite()" in message
    assert [p.name for p in saved.iterdir()] == ["kept"]
