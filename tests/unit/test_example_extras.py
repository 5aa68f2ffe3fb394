"""The examples check on the driver, before anything starts, that what their ranks import is
installed, and name the extra that installs it."""

from __future__ import annotations

import importlib
import sys

import pytest

from sparktrain.examples import _common

# Each example, the options that reach its check, and a module its ranks import that the
# sparktrain package itself does not install, with the extra that does.
CASES = [
    ("digits", ["--np", "2"], "sklearn", "scikit-learn", "examples"),
    ("digits", ["--np", "-2"], "sklearn", "scikit-learn", "examples"),
    ("dist_torch_starter", ["--np", "2"], "sklearn", "scikit-learn", "examples"),
    ("mnist_horovod", ["--np", "2"], "sklearn", "scikit-learn", "examples"),
    ("torch_hvd_mnist", ["--np", "2"], "sklearn", "scikit-learn", "examples"),
    ("lightning_digits", ["--np", "2"], "lightning", "lightning", "frameworks"),
    ("hf_trainer", ["--np", "2"], "transformers", "transformers", "frameworks"),
    ("digits_pipeline", ["--np", "-2"], "sklearn", "scikit-learn", "examples"),
    ("ddp_trainer", ["--np", "2"], "pyspark", "pyspark", "spark"),
]

# What else each example checks for besides the case's module, where that may be missing too
# (pyspark is installed wherever this suite runs).
OTHERS = {"hf_trainer": ("accelerate", "sklearn"), "lightning_digits": ("sklearn",)}


@pytest.fixture
def no_spark(monkeypatch):
    """Starting a Spark session (or the local ranks) is a failure of the test."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("Spark was started before the check")

    # Every example is imported before the patch: one first imported under it would keep
    # ``refuse`` for the rest of the process if it bound the name at import.
    for name in {case[0] for case in CASES}:
        importlib.import_module(f"sparktrain.examples.{name}")
    monkeypatch.setattr(_common, "spark_session", refuse)
    monkeypatch.setattr(_common, "spark_for", refuse)


@pytest.mark.parametrize(("name", "argv", "module", "package", "extra"), CASES)
def test_a_missing_module_stops_the_example_before_spark_with_the_pip_command(
    name, argv, module, package, extra, monkeypatch, capsys, no_spark, tmp_path
):
    example = importlib.import_module(f"sparktrain.examples.{name}")
    # The example's other modules must be there for the message to name this one alone (an
    # environment without the frameworks extra lacks accelerate beside transformers).
    for other in OTHERS.get(name, ()):
        pytest.importorskip(other)
    monkeypatch.chdir(tmp_path)
    # As when it is not installed: `import sklearn` fails, and find_spec finds nothing.
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(SystemExit) as stop:
        example.main(argv)
    message = str(stop.value.code)
    assert message == (
        f"sparktrain.examples.{name} needs {package}, not installed for {sys.executable}: "
        f"pip install 'sparktrain[{extra}]'"
    )
    assert "Data:" not in capsys.readouterr().out  # nothing said about a run that cannot go


def test_every_missing_module_and_extra_is_named_at_once(monkeypatch):
    for module in ("sklearn", "lightning", "pyspark"):
        monkeypatch.setitem(sys.modules, module, None)
    args = _common.parse(_common.make_parser("lightning_digits", "", data=False), ["--np", "2"])
    with pytest.raises(SystemExit) as stop:
        _common.require(args, "lightning", "sklearn")
    assert str(stop.value.code).endswith(
        "needs lightning, scikit-learn, pyspark, not installed for "
        f"{sys.executable}: pip install 'sparktrain[examples,frameworks,spark]'"
    )


def test_local_ranks_do_not_need_pyspark_and_installed_modules_pass(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "pyspark", None)
    parser = _common.make_parser("digits", "", data=False)
    looked: list[str] = []
    find_spec = importlib.util.find_spec

    def logged(name, *rest):
        looked.append(name)
        return find_spec(name, *rest)

    monkeypatch.setattr(_common.importlib.util, "find_spec", logged)
    assert _common.require(_common.parse(parser, ["--np", "-2"]), "sklearn") is None
    assert looked == ["sklearn"]
    with pytest.raises(SystemExit, match=r"pip install 'sparktrain\[spark\]'"):
        _common.require(_common.parse(parser, ["--np", "2"]), "sklearn")
