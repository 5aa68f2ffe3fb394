"""The stated public API: ``sparktrain.__all__``, imported on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sparktrain


def _imported_after(code: str) -> list[str]:
    """The sparktrain modules a fresh interpreter has imported after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sparktrain'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_import_sparktrain_imports_nothing_else_of_it() -> None:
    assert _imported_after("import sparktrain") == ["sparktrain"]


def test_a_ranks_context_does_not_import_the_drivers_side() -> None:
    # What a rank's process runs (python -m sparktrain.worker, or forked from a zygote), and
    # what its training function imports.
    loaded = _imported_after(
        "import sparktrain.worker.bootstrap, sparktrain.worker.zygote\n"
        "from sparktrain import rank, world_size, should_stop, report"
    )
    assert "sparktrain.worker.context" in loaded
    driver_side = [
        m for m in loaded if (m + ".x").split(".")[1] in {"driver", "runner", "config", "task"}
    ]
    assert driver_side == []


def test_all_is_sorted_and_every_name_resolves_to_where_it_is_defined() -> None:
    assert sparktrain.__all__ == sorted(sparktrain.__all__)
    for name in sparktrain.__all__:
        value = getattr(sparktrain, name)
        assert value.__name__ == name
        assert value.__module__ == sparktrain._WHERE[name]
    assert set(sparktrain.__all__) <= set(dir(sparktrain))


def test_star_import_gives_exactly_the_public_names() -> None:
    space: dict[str, object] = {}
    exec("from sparktrain import *", space)
    assert sorted(k for k in space if k != "__builtins__") == sparktrain.__all__


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'SparkRuner'"):
        sparktrain.SparkRuner  # noqa: B018
    with pytest.raises(ImportError, match="SparkRuner"):
        exec("from sparktrain import SparkRuner", {})
