"""Pickling the call and the result: round trips, limits, and naming what cannot be pickled."""

from __future__ import annotations

import functools
import socket
import threading
from typing import Any

import cloudpickle
import pytest

from sparktrain.errors import PayloadError, SparkTrainError
from sparktrain.shipping.payload import dump_call, dump_result, dumps, load_call, load_result

BIG = 1 << 30

# Functions in an importable module are pickled by reference, so what their globals hold
# never travels. Functions of a notebook cell or a script's __main__ are pickled by value,
# globals included: build those in a namespace of a module that cannot be imported.
NOTEBOOK_CELL = """
import threading

GLOBAL_LOCK = threading.Lock()
SCALE = 3


def uses_global_lock():
    with GLOBAL_LOCK:
        pass


def calls_a_helper_that_uses_the_lock():
    uses_global_lock()


def defines_an_inner_function_using_the_lock():
    def inner():
        with GLOBAL_LOCK:
            pass

    return inner


def default_lock(x, lock=GLOBAL_LOCK):
    return x


def kwdefault_lock(x, *, guard=GLOBAL_LOCK):
    return x


def scaled(x):
    return x * SCALE
"""


def notebook() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "sparktrain_test_notebook_cell"}
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), namespace)
    return namespace


def add(a: int, b: int = 0, *, scale: int = 1) -> int:
    return (a + b) * scale


class Trainer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lr = 0.1

    def train(self) -> float:
        return self.lr


class Plain:
    def __init__(self, lr: float) -> None:
        self.lr = lr

    def train(self, factor: float) -> float:
        return self.lr * factor


def payload_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(PayloadError) as info:
        dump_call(fn, args, kwargs, BIG)
    assert isinstance(info.value, SparkTrainError)
    return str(info.value)


# --- round trips -------------------------------------------------------------------------------


def test_call_round_trip() -> None:
    data = dump_call(add, (1,), {"b": 2, "scale": 10}, BIG)
    fn, args, kwargs = load_call(data)
    assert fn(*args, **kwargs) == 30
    assert args == (1,) and kwargs == {"b": 2, "scale": 10}


def test_closure_lambda_partial_and_bound_method_round_trip() -> None:
    offset = 5
    closure = lambda x: x + offset  # noqa: E731
    for fn, args, expected in [
        (closure, (1,), 6),
        (notebook()["scaled"], (2,), 6),  # by value, with the global it reads
        (functools.partial(add, 2, scale=2), (3,), 10),
        (Plain(0.5).train, (4.0,), 2.0),
    ]:
        loaded, loaded_args, loaded_kwargs = load_call(dump_call(fn, args, {}, BIG))
        assert loaded(*loaded_args, **loaded_kwargs) == expected


def test_args_become_a_tuple_and_kwargs_a_dict() -> None:
    _, args, kwargs = load_call(dump_call(add, [1, 2], {}, BIG))  # type: ignore[arg-type]
    assert args == (1, 2) and isinstance(args, tuple) and kwargs == {}


@pytest.mark.parametrize(
    "value", [None, 0.5, {"loss": [0.1, 0.2], "name": "m"}, (1, "a"), b"\x00" * 100, Plain(2.0)]
)
def test_result_round_trip(value: Any) -> None:
    again = load_result(dump_result(value, BIG))
    if isinstance(value, Plain):
        assert again.lr == 2.0
    else:
        assert again == value


# --- naming the culprit ------------------------------------------------------------------------


def test_lock_in_closure_is_named() -> None:
    lock = threading.Lock()

    def train() -> None:
        with lock:
            pass

    message = payload_error(train)
    assert "The culprit is the variable 'lock' captured by train()" in message
    assert "_thread.lock" in message
    assert "cannot send 'train' to the ranks" in message
    assert "Create such objects inside the function" in message


def test_lock_in_global_is_named() -> None:
    message = payload_error(notebook()["uses_global_lock"])
    assert "the global 'GLOBAL_LOCK' used by uses_global_lock()" in message


def test_lock_in_default_argument_is_named() -> None:
    message = payload_error(notebook()["default_lock"], 1)
    assert "default argument #0 of default_lock()" in message
    assert "_thread.lock" in message


def test_lock_in_keyword_only_default_is_named() -> None:
    message = payload_error(notebook()["kwdefault_lock"], 1)
    assert "the default of 'guard' in kwdefault_lock()" in message


def test_lock_reached_through_a_called_helper_is_named() -> None:
    message = payload_error(notebook()["calls_a_helper_that_uses_the_lock"])
    assert "The culprit is the global 'GLOBAL_LOCK' used by uses_global_lock()" in message
    assert (
        "(reached through the global 'uses_global_lock' used by "
        "calls_a_helper_that_uses_the_lock())"
    ) in message


def test_lock_used_by_a_nested_function_is_named() -> None:
    message = payload_error(notebook()["defines_an_inner_function_using_the_lock"])
    assert "the global 'GLOBAL_LOCK' used by defines_an_inner_function_using_the_lock()" in (
        message
    )


def test_lock_in_a_closure_of_a_captured_function_is_named() -> None:
    lock = threading.Lock()

    def helper() -> None:
        with lock:
            pass

    def train() -> None:
        helper()

    message = payload_error(train)
    assert "The culprit is the variable 'lock' captured by helper()" in message
    assert "(reached through the variable 'helper' captured by train())" in message


def test_bound_methods_object_is_named() -> None:
    message = payload_error(Trainer().train)
    assert "the object Trainer the method is bound to" in message
    assert "_thread.lock" in message


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_unpicklable_argument_is_named(how: str) -> None:
    lock = threading.Lock()
    if how == "keyword":
        message = payload_error(add, 1, guard=lock)
        assert "The culprit is keyword argument 'guard', of type _thread.lock" in message
    else:
        message = payload_error(add, 1, lock)
        assert "The culprit is argument #1, of type _thread.lock" in message


def test_open_socket_argument_is_named_with_its_type() -> None:
    with socket.socket() as sock:
        message = payload_error(add, 1, client=sock)
    assert "keyword argument 'client', of type socket.socket" in message


def test_first_culprit_wins_arguments_before_captures() -> None:
    message = payload_error(notebook()["uses_global_lock"], threading.Lock())
    assert "The culprit is argument #0" in message


def test_attribute_named_like_a_global_is_not_blamed() -> None:
    cell = notebook()
    with socket.socket() as sock:
        cell["sock"] = sock
        exec("def train(cfg, client=sock):\n    return cfg.GLOBAL_LOCK\n", cell)
        # cloudpickle itself does not drag the global along:
        cloudpickle.dumps(cell["scaled"])
        exec("def reads(cfg):\n    return cfg.GLOBAL_LOCK\n", cell)
        cloudpickle.dumps(cell["reads"])
        message = payload_error(cell["train"], Plain(1.0))
    assert "default argument #0 of train()" in message
    assert "GLOBAL_LOCK" not in message


def test_message_without_a_culprit_still_explains() -> None:
    class Unpicklable:
        def __reduce__(self) -> Any:
            raise RuntimeError("no pickling for you")

    # Nothing separately unpicklable is found when the function is a callable object.
    class Call:
        def __init__(self) -> None:
            self.state = Unpicklable()

        def __call__(self) -> None:
            pass

    message = payload_error(Call())
    assert "RuntimeError: no pickling for you" in message
    assert "Create such objects inside the function" in message


# --- other errors and limits -------------------------------------------------------------------


@pytest.mark.parametrize("fn, type_name", [(None, "NoneType"), (42, "int"), ("train", "str")])
def test_non_callable_is_refused(fn: Any, type_name: str) -> None:
    with pytest.raises(
        PayloadError, match=f"needs a function to run on each rank; got {type_name}"
    ):
        dump_call(fn, (), {}, BIG)


def test_payload_limit_names_the_setting() -> None:
    blob = b"x" * (2 << 20)
    with pytest.raises(PayloadError) as info:
        dump_call(add, (blob,), {}, 1 << 20)
    message = str(info.value)
    assert "max_payload_bytes" in message and "spark.sparktrain.maxPayloadBytes" in message
    assert "2.0 MiB" in message and "1.0 MiB" in message


def test_payload_at_the_limit_passes() -> None:
    data = dump_call(add, (1,), {}, BIG)
    call = len(dumps((add, (1,), {})))  # the limit is on the call's pickle, modules aside
    assert dump_call(add, (1,), {}, call) == data
    with pytest.raises(PayloadError):
        dump_call(add, (1,), {}, call - 1)


def test_captured_large_data_counts_towards_the_limit() -> None:
    blob = b"y" * (1 << 20)

    def train() -> int:
        return len(blob)

    with pytest.raises(PayloadError, match="over the limit"):
        dump_call(train, (), {}, 1 << 19)


def _generator() -> Any:
    yield 1


@pytest.mark.parametrize(
    "value, type_name", [(threading.Lock(), "_thread.lock"), (_generator(), "generator")]
)
def test_unpicklable_result_is_refused(value: Any, type_name: str) -> None:
    with pytest.raises(PayloadError) as info:
        dump_result(value, BIG)
    message = str(info.value)
    assert f"rank 0 returned a {type_name} that cannot be pickled" in message
    assert "return plain data" in message
    assert isinstance(info.value.__cause__, Exception)


def test_result_limit_names_the_setting() -> None:
    with pytest.raises(PayloadError) as info:
        dump_result(b"z" * (3 << 20), 1 << 20)
    message = str(info.value)
    assert "max_result_bytes" in message and "spark.sparktrain.maxResultBytes" in message
    assert "sparktrain.checkpoint.save" in message


def test_result_at_the_limit_passes() -> None:
    data = dump_result([1, 2, 3], BIG)
    assert dump_result([1, 2, 3], len(data)) == data
    with pytest.raises(PayloadError, match="over the limit"):
        dump_result([1, 2, 3], len(data) - 1)
