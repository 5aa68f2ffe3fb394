"""sparktrain.log: library messages reach stderr by default, and logging config takes over."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparktrain.log import get_logger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_sparktrain_logger() -> Iterator[logging.Logger]:
    """Each test starts with the 'sparktrain' logger as a new process has it, and restores it."""
    top = logging.getLogger("sparktrain")
    saved = (list(top.handlers), top.level, top.propagate)
    top.handlers = [h for h in top.handlers if not getattr(h, "sparktrain_default", False)]
    top.setLevel(logging.NOTSET)
    top.propagate = True
    yield top
    top.handlers, level, top.propagate = saved
    top.setLevel(level)


@contextlib.contextmanager
def unconfigured(level: int = logging.WARNING) -> Iterator[logging.Logger]:
    """Logging as in a process where nobody configured it: no root handler, root at WARNING.

    (pytest adds its capture handlers to the root logger as each test's call starts, so this
    is entered in the test's body, not in a fixture.)
    """
    root = logging.getLogger()
    saved = (root.handlers, root.level)
    root.handlers = []
    root.setLevel(level)
    try:
        yield root
    finally:
        root.handlers = saved[0]
        root.setLevel(saved[1])


@pytest.fixture
def stderr(capsys: pytest.CaptureFixture[str]) -> Callable[[], str]:
    """What reached sys.stderr since the last call.

    capsys replaces sys.stderr, as notebooks do: the handler must write to the current one.
    """
    return lambda: capsys.readouterr().err


def test_getting_a_logger_changes_no_logging_state(
    _fresh_sparktrain_logger: logging.Logger,
) -> None:
    get_logger("sparktrain.driver.capacity")
    assert _fresh_sparktrain_logger.handlers == []
    assert _fresh_sparktrain_logger.level == logging.NOTSET


def test_info_reaches_stderr_with_the_prefix_when_nothing_is_configured(
    stderr: Callable[[], str],
) -> None:
    logger = get_logger("sparktrain.driver.capacity")
    with unconfigured():
        logger.info("waiting up to %.0fs for executors", 60.0)
        logger.debug("not shown")
    assert stderr() == "sparktrain: waiting up to 60s for executors\n"


def test_the_handler_is_added_once(
    stderr: Callable[[], str], _fresh_sparktrain_logger: logging.Logger
) -> None:
    with unconfigured():
        for name in ("sparktrain.a", "sparktrain.b", "sparktrain.a"):
            get_logger(name).warning("x")
    assert len(_fresh_sparktrain_logger.handlers) == 1
    assert stderr() == "sparktrain: x\n" * 3


def test_exception_includes_the_traceback(stderr: Callable[[], str]) -> None:
    with unconfigured():
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            get_logger("sparktrain.x").exception("it failed")
    text = stderr()
    assert text.startswith("sparktrain: it failed\nTraceback") and "RuntimeError: boom" in text


def test_caplog_gets_the_records_and_stderr_stays_quiet(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        get_logger("sparktrain.driver.capacity").info("waiting for %d slots", 4)
    [record] = caplog.records
    assert record.name == "sparktrain.driver.capacity"
    assert record.levelno == logging.INFO and record.getMessage() == "waiting for 4 slots"
    # The record says where it was logged from: here, not sparktrain/log.py.
    assert record.funcName == "test_caplog_gets_the_records_and_stderr_stays_quiet"
    assert record.pathname == __file__
    assert capsys.readouterr().err == ""  # caplog's handler on root took it


def test_a_root_handler_takes_over_without_double_printing(stderr: Callable[[], str]) -> None:
    mine = io.StringIO()
    handler = logging.StreamHandler(mine)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    with unconfigured() as root:
        root.addHandler(handler)
        get_logger("sparktrain.runner").info("attempt 1/2 failed")
    assert mine.getvalue() == "sparktrain.runner INFO attempt 1/2 failed\n"
    assert stderr() == ""


def test_a_handler_on_sparktrain_takes_over(
    stderr: Callable[[], str], _fresh_sparktrain_logger: logging.Logger
) -> None:
    mine = io.StringIO()
    _fresh_sparktrain_logger.addHandler(logging.StreamHandler(mine))
    with unconfigured():
        get_logger("sparktrain.runner").warning("once")
    assert mine.getvalue() == "once\n" and stderr() == ""


def test_silencing(stderr: Callable[[], str], _fresh_sparktrain_logger: logging.Logger) -> None:
    _fresh_sparktrain_logger.setLevel(logging.WARNING)  # set before the first message: kept
    with unconfigured():
        get_logger("sparktrain.x").info("hidden")
        assert _fresh_sparktrain_logger.level == logging.WARNING
        get_logger("sparktrain.x").warning("shown")
        _fresh_sparktrain_logger.addHandler(logging.NullHandler())
        get_logger("sparktrain.x").warning("hidden too")
    assert stderr() == "sparktrain: shown\n"


def test_a_more_verbose_root_level_is_kept(
    stderr: Callable[[], str], _fresh_sparktrain_logger: logging.Logger
) -> None:
    with unconfigured(level=logging.DEBUG):
        get_logger("sparktrain.x").debug("detail")
    assert _fresh_sparktrain_logger.level == logging.NOTSET
    assert stderr() == "sparktrain: detail\n"


def test_propagate_false_with_no_handler_of_the_users_keeps_ours(
    stderr: Callable[[], str], _fresh_sparktrain_logger: logging.Logger
) -> None:
    with unconfigured() as root:
        root.addHandler(logging.StreamHandler(io.StringIO()))
        _fresh_sparktrain_logger.propagate = False  # the root's handler is not on the way
        get_logger("sparktrain.x").info("here")
    assert stderr() == "sparktrain: here\n"


def test_extra_is_passed_through(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="sparktrain"):
        get_logger("sparktrain.x").info("rank line", extra={"rank": 3})
    assert caplog.records[0].rank == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name, full",
    [
        ("sparktrain", "sparktrain"),
        ("sparktrain.task.entry", "sparktrain.task.entry"),
        ("__main__", "sparktrain.__main__"),
        ("sparktrainer", "sparktrain.sparktrainer"),
    ],
)
def test_names_outside_sparktrain_are_put_under_it(name: str, full: str) -> None:
    assert get_logger(name).logger.name == full


# -- a fresh interpreter, its real stderr -----------------------------------------------------


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_real_stderr_of_a_fresh_process() -> None:
    done = python(
        "import logging; from sparktrain.log import get_logger\n"
        "log = get_logger('sparktrain.driver.capacity')\n"
        "assert not logging.getLogger('sparktrain').handlers  # nothing at import\n"
        "log.info('waiting'); log.debug('hidden'); log.warning('late')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "sparktrain: waiting\nsparktrain: late\n" and done.stdout == ""


def test_basic_config_in_a_fresh_process_prints_once() -> None:
    done = python(
        "import logging; from sparktrain.log import get_logger\n"
        "get_logger('sparktrain.x').info('before')\n"
        "logging.basicConfig(format='%(levelname)s:%(name)s:%(message)s')\n"
        "get_logger('sparktrain.x').info('after')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "sparktrain: before\nINFO:sparktrain.x:after\n"


def test_info_comes_back_when_the_level_is_set_back_to_nothing(
    stderr: Callable[[], str], _fresh_sparktrain_logger: logging.Logger
) -> None:
    """A log capture that saved 'nothing set' before sparktrain's first message restores it
    after: the next message sets INFO again, rather than leaving INFO unseen for good."""
    with unconfigured():
        get_logger("sparktrain.x").info("first")
        assert _fresh_sparktrain_logger.level == logging.INFO
        _fresh_sparktrain_logger.setLevel(logging.NOTSET)  # what the capture restores
        get_logger("sparktrain.x").info("second")
        assert _fresh_sparktrain_logger.level == logging.INFO
    assert stderr() == "sparktrain: first\nsparktrain: second\n"
