"""The call is checked against the function's signature on the driver, before any launch."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from sparktrain import CallError, PayloadError, SparkRunner
from sparktrain.shipping.signature import check_call


def train(lr, epochs=1, *, seed=0):  # noqa: ANN001, ANN201 - the signature is what is shown
    return lr * epochs + seed


def flexible(*args: Any, **kwargs: Any) -> int:
    return len(args) + len(kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((0.1,), {"lrr": 0.1}, "unexpected keyword 'lrr'"),
        ((), {"lrr": 0.1}, "unexpected keyword 'lrr' (did you mean 'lr'?)"),
        (
            (0.1,),
            {"epoch": 2, "sed": 1},
            "'epoch' (did you mean 'epochs'?); unexpected keyword 'sed' (did you mean 'seed'?)",
        ),
        ((), {}, "missing a required argument: 'lr'"),
        ((0.1, 2, 3), {}, "too many positional arguments"),
        ((0.1,), {"lr": 0.2}, "multiple values for argument 'lr'"),
    ],
)
def test_a_call_that_does_not_fit_is_refused_naming_what(
    args: tuple[Any, ...], kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(CallError) as info:
        check_call(train, args, kwargs)
    message = str(info.value)
    assert says in message
    assert "train(lr, epochs=1, *, seed=0)" in message
    assert "Nothing was started" in message
    # Both the tree's PayloadError and Python's own TypeError catch it.
    assert isinstance(info.value, PayloadError) and isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (train, (0.1,), {}),
        (train, (), {"lr": 0.1, "epochs": 3, "seed": 1}),
        (flexible, (1, 2), {"anything": 3}),
        (functools.partial(train, 0.1), (), {"epochs": 2}),
        (print, ("builtins are called as they are",), {}),
    ],
)
def test_a_call_that_fits_passes(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    check_call(fn, args, kwargs)  # raises on a mismatch: see the test above
    assert fn(*args, **kwargs) is not None or fn is print


def test_run_refuses_a_misspelt_keyword_before_starting_anything(monkeypatch) -> None:
    """No rank starts: the launch itself is made to fail if it were reached."""
    started = []

    def no_launch(*args: Any, **kwargs: Any) -> None:
        started.append(args)
        raise AssertionError("a launch was started")

    runner = SparkRunner(np=-2)
    monkeypatch.setattr("sparktrain.driver.controller.dump_call", no_launch)
    with pytest.raises(CallError) as info:
        runner.run(train, lrr=0.1)
    # Python alone would say "missing a required argument: 'lr'", hiding the misspelling.
    assert "unexpected keyword 'lrr' (did you mean 'lr'?)" in str(info.value)
    assert "missing" not in str(info.value)
    assert started == []
