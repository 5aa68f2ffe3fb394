"""A function pickled by value keeps its file and lines, whatever cloudpickle is installed.

cloudpickle 3.1.3 rebuilds every code object it pickles by value with the file name
``<dynamic-code>``; these tests hold with the pinned cloudpickle (3.1.2) and with the newest
(``scripts/test-newest.sh`` runs them there, and with the lowest that pyproject.toml allows).
"""

from __future__ import annotations

import importlib.util
import pickle
import traceback
from pathlib import Path
from types import ModuleType

import cloudpickle
import pytest

from sparktrain.shipping.payload import dump_call, dump_result, dumps, load_call, load_result

USER_FILE = """\
import sys


def train(depth):
    def step():
        raise ValueError("loss is nan")

    if depth:
        return step()
    return sys._getframe()


class Model:
    def forward(self):
        return [sys._getframe() for _ in range(1)][0]
"""
STEP_LINE = 6  # raise ValueError(...)
CALL_LINE = 9  # return step()
FRAME_LINE = 10  # return sys._getframe()


@pytest.fixture
def user_module(tmp_path: Path) -> ModuleType:
    """A module of the user's own file that the ranks cannot import: pickled by value."""
    path = tmp_path / "my_training.py"
    path.write_text(USER_FILE)
    spec = importlib.util.spec_from_file_location("my_training_not_importable", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not in sys.modules: cloudpickle ships it by value
    return module


def _frames(error: BaseException) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(error.__traceback__)]


def test_a_rank_traceback_names_the_users_file_and_lines(user_module: ModuleType) -> None:
    path = user_module.__file__
    fn, args, kwargs = load_call(dump_call(user_module.train, (1,), {}, 1 << 20))
    with pytest.raises(ValueError, match="loss is nan") as info:
        fn(*args, **kwargs)
    frames = _frames(info.value)[1:]  # below this test's own frame
    assert frames == [(path, CALL_LINE, "train"), (path, STEP_LINE, "step")]
    formatted = "".join(traceback.format_exception(info.value))
    assert f'File "{path}", line {STEP_LINE}, in step' in formatted
    assert 'raise ValueError("loss is nan")' in formatted  # the source line, read from the file
    assert "<dynamic-code>" not in formatted


def test_a_stack_dump_names_the_users_file_and_line(user_module: ModuleType) -> None:
    """Stack dumps read each frame's code: the function's own and the code nested in it."""
    fn, _, _ = load_call(dump_call(user_module.train, (0,), {}, 1 << 20))
    frame = fn(0)
    assert (frame.f_code.co_filename, frame.f_lineno) == (user_module.__file__, FRAME_LINE)
    nested = [c for c in fn.__code__.co_consts if hasattr(c, "co_filename")]
    assert [c.co_filename for c in nested] == [user_module.__file__]


def test_methods_of_a_class_pickled_by_value_keep_their_file(user_module: ModuleType) -> None:
    """A result (or argument) holding an instance of the user's class: its methods' code."""
    model = load_result(dump_result(user_module.Model(), 1 << 20))
    frame = model.forward()
    assert frame.f_code.co_filename == user_module.__file__


def test_a_plain_unpickler_reads_the_payload(user_module: ModuleType) -> None:
    """The payload needs sparktrain where it is loaded (the ranks have it), nothing more."""
    data = dumps(user_module.train)
    assert pickle.loads(data).__code__.co_filename == user_module.__file__
    assert cloudpickle.loads(data).__code__.co_firstlineno == 4


def test_a_failed_ranks_error_names_the_users_file_and_line(user_module: ModuleType) -> None:
    """What the user reads: the WorkerFailedError of a real run (one rank on this machine)."""
    from sparktrain import SparkRunner
    from sparktrain.errors import WorkerFailedError

    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=-1, progress=False).run(user_module.train, 1)
    message = str(info.value)
    path = user_module.__file__
    assert f'File "{path}", line {CALL_LINE}, in train' in message
    assert f'File "{path}", line {STEP_LINE}, in step' in message
    assert "<dynamic-code>" not in message
