"""Progress: the driver's progress bar, fed with report messages; RunRecord: their history."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from sparktrain.driver.progress import Progress
from sparktrain.driver.run_record import AttemptRecord, RunRecord, launch_breakdown


def report(rank=0, step=None, epoch=None, **metrics):
    return {"type": "report", "rank": rank, "step": step, "epoch": epoch, "metrics": metrics}


def test_bar_appears_on_first_report_with_rank0_metrics_as_postfix():
    out = io.StringIO()
    progress = Progress(total=3, unit="epoch", file=out)
    assert out.getvalue() == ""  # nothing until a report arrives
    progress.on_report(report(epoch=0, step=9, loss=0.75))
    # Not rank 0: not shown.
    progress.on_report(report(rank=1, epoch=0, step=9, loss=9.0, seen_on=1))
    progress.on_report(report(epoch=1, step=19, loss=0.5, acc=0.9))
    progress.close()
    text = out.getvalue()
    last = text.strip().split("\r")[-1]
    assert "sparktrain" in last and "2/3" in last
    assert "epoch=1" in last and "step=19" in last and "loss=0.5" in last and "acc=0.9" in last
    # The rate ("6159.04epoch/s") may hold any digits: look for the metrics by name.
    assert "loss=9.0" not in text and "seen_on" not in text


def test_latest_follows_rank0_only():
    progress = Progress(display=False)
    for message in (
        report(step=0, loss=1.0),
        report(step=1, loss=0.5, time=3.0),
        report(rank=1, step=5, loss=2.0),
    ):
        progress.on_report(message)
    row = progress.latest
    assert row is not None and (row["rank"], row["step"], row["loss"]) == (0, 1, 0.5)
    assert row["time_"] == 3.0 and isinstance(row["time"], float)  # a metric named "time"
    assert list(row)[:3] == ["rank", "step", "epoch"]


def test_run_record_keeps_every_rank_and_makes_one_frame():
    pd = pytest.importorskip("pandas")
    record = RunRecord()
    assert list(record.frame().columns) == ["rank", "step", "epoch"]
    for message in (report(step=0, epoch=0, loss=1.0), report(rank=1, step=0, epoch=0, loss=2.0)):
        record.add_report(message)
    record.add_report(report(step=1, epoch=0, loss=0.5))
    assert [r["rank"] for r in record.reports] == [0, 1, 0]
    assert all(isinstance(r["time"], float) for r in record.reports)
    frame = record.frame()
    assert isinstance(frame, pd.DataFrame)
    assert frame["loss"].tolist() == [1.0, 2.0, 0.5] and frame["rank"].tolist() == [0, 1, 0]


def test_run_record_phases_sum_over_attempts_in_order():
    record = RunRecord()
    assert not record.succeeded and record.phases == {}
    record.attempts.append(
        AttemptRecord(0, {"submit": 1.0, "rendezvous": 2.0}, ValueError("lost"), "lost")
    )
    record.attempts.append(
        AttemptRecord(1, {"training": 4.0, "submit": 0.5, "capacity_wait": 0.25, "teardown": 1})
    )
    assert list(record.phases.items()) == [
        ("capacity_wait", 0.25),
        ("submit", 1.5),
        ("rendezvous", 2.0),
        ("training", 4.0),
        ("teardown", 1.0),
    ]
    assert record.succeeded
    assert record.describe().splitlines() == [
        "attempt 1: failed: lost (submit 1.00s, rendezvous 2.00s)",
        "attempt 2: ok (capacity_wait 0.25s, submit 0.50s, training 4.00s, teardown 1.00s)",
    ]
    # A REPL or a notebook shows the table as it reads, not as an escaped one-line string.
    text = record.describe()
    assert isinstance(text, str) and repr(text) == str(text) and "\n" in repr(text)
    shown: list[str] = []

    class Printer:  # what IPython's pretty printer hands a _repr_pretty_ method
        def text(self, value: str) -> None:
            shown.append(value)

    text._repr_pretty_(Printer(), False)
    assert shown == [str(text)]
    try:
        from IPython.lib.pretty import pretty
    except ImportError:  # IPython is optional; the method above is what it calls
        pass
    else:
        assert pretty(text) == str(text)
    assert text.splitlines()[0].startswith("attempt 1: failed")  # still a str to callers


def test_launch_breakdown_splits_rank0s_training_by_step():
    times = {
        "go": 100.0,
        "spawned": 100.01,
        "begun": 100.03,
        "called": 100.04,
        "returned": 101.04,
        "written": 101.05,
        "forked": True,
    }
    spent = launch_breakdown(times, training=1.25)
    assert spent.pop("forked") is True
    assert {k: round(float(v), 3) for k, v in spent.items()} == {
        "prepare": 0.01,
        "start": 0.02,
        "load": 0.01,
        "function": 1.0,
        "result": 0.01,
        "return": 0.2,  # training less go..written: the way back to the driver
    }
    # A rank that did not return has no timestamps of its own: only what its task saw.
    assert launch_breakdown({"go": 1.0, "spawned": 1.5, "forked": False}, 9.0) == {
        "forked": False,
        "prepare": 0.5,
    }
    assert launch_breakdown(None, 3.0) == {}
    record = RunRecord()
    record.attempts.append(
        AttemptRecord(0, {"training": 1.25}, breakdown=launch_breakdown(times, 1.25))
    )
    assert record.describe().splitlines()[1] == (
        "  rank 0 (forked warm): prepare 0.01s, start 0.02s, load 0.01s, function 1.00s, "
        "result 0.01s, return 0.20s"
    )


def test_no_report_shows_nothing_and_close_is_idempotent(capsys):
    out = io.StringIO()
    progress = Progress(file=out)
    progress.close()
    progress.close()
    assert out.getvalue() == "" and progress.latest is None
    assert capsys.readouterr() == ("", "")


def test_total_can_be_set_later_and_unit_changed():
    out = io.StringIO()
    progress = Progress(file=out)  # counts reports, no total
    progress.on_report(report(step=4, loss=1.0))
    progress.set_total(10, unit="step")
    progress.on_report(report(step=6, loss=0.9))
    progress.close()
    assert "7/10" in out.getvalue().split("\r")[-1]
    with pytest.raises(ValueError, match="unit"):
        progress.set_total(3, unit="batch")


def test_without_tqdm_prints_plain_lines(monkeypatch):
    for name in ("tqdm", "tqdm.auto", "tqdm.std"):
        monkeypatch.setitem(sys.modules, name, None)  # import tqdm → ImportError
    out = io.StringIO()
    progress = Progress(total=2, unit="epoch", file=out, plain_interval=3600)
    progress.on_report(report(epoch=0, loss=0.25))
    progress.on_report(report(epoch=1, loss=0.125))  # within the interval: held back
    assert out.getvalue() == "sparktrain: 1/2 epochs epoch=0 loss=0.25\n"
    progress.close()  # the last state always shows
    progress.close()
    assert out.getvalue().splitlines()[-1] == "sparktrain: 2/2 epochs epoch=1 loss=0.125"


def test_not_a_terminal_falls_back_to_plain_lines(monkeypatch):
    err = io.StringIO()  # not a tty, not a notebook
    monkeypatch.setattr(sys, "stderr", err)
    progress = Progress(plain_interval=0)
    progress.on_report(report(step=0, loss=1.5))
    progress.close()
    assert err.getvalue() == "sparktrain: step=0 loss=1.5\n"


def test_display_error_becomes_one_warning_and_reports_still_count():
    class Broken(io.StringIO):
        def write(self, text):
            raise RuntimeError("display gone")

    progress = Progress(file=Broken())
    with pytest.warns(RuntimeWarning, match="progress display failed"):
        progress.on_report(report(step=0, loss=1.0))
    progress.on_report(report(step=1, loss=0.5))  # no second warning (pytest would fail on it)
    progress.close()
    assert progress.latest is not None and progress.latest["step"] == 1


def test_wrapped_stream_writes_whole_lines_around_the_bar():
    bar_out, log_out = io.StringIO(), io.StringIO()
    progress = Progress(file=bar_out)
    stream = progress.wrap(log_out)
    print("[rank 0] before the bar", file=stream, flush=True)
    progress.on_report(report(step=0, loss=1.0))
    print("[rank 1] while the bar shows", file=stream, flush=True)
    progress.close()
    assert log_out.getvalue() == "[rank 0] before the bar\n[rank 1] while the bar shows\n"


def test_a_notebook_without_ipywidgets_gets_tqdms_text_bar_and_no_warning(monkeypatch):
    """In a Jupyter kernel, importing tqdm.auto without ipywidgets warns "IProgress not found"
    (and its widget cannot render): the text bar is used there, and tqdm.auto not imported."""
    import importlib.util
    import types
    import warnings

    from tqdm import std

    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # importing it now raises ImportError
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ipywidgets" else real_find_spec(name, *a),
    )
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        progress = Progress(total=2, unit="epoch")
        progress.on_report(report(epoch=0, loss=0.5))
        progress.close()
    assert progress._tqdm is std.tqdm  # a bar, not the plain lines tqdm.auto's failure gives
    assert "1/2" in err.getvalue() and "loss=0.5" in err.getvalue()


class _Bar:
    def __init__(self) -> None:
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


class _Option:
    """Scala's Option, as Py4J shows ``SparkContext.progressBar()``."""

    def __init__(self, bar: _Bar | None) -> None:
        self.bar = bar

    def isDefined(self) -> bool:  # noqa: N802 - Scala's name
        return self.bar is not None

    def get(self) -> _Bar:
        assert self.bar is not None
        return self.bar


class _Context:
    def __init__(self, bar: _Bar | None) -> None:
        option = _Option(bar)

        class Jsc:
            def sc(self) -> Any:
                class Scala:
                    def progressBar(self) -> _Option:  # noqa: N802
                        return option

                return Scala()

        self._jsc = Jsc()


def test_spark_console_bar_is_stopped_also_where_the_output_is_piped(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python train.py 2>&1 | tee train.log``, or a notebook's cell: not a terminal, but
    the bar's ``\r[Stage 1:>  (0 + 2) / 2]`` and the next ``[rank 0]`` line still end up on
    one line."""
    import logging
    import os

    from sparktrain.driver.progress import quiet_spark_console

    read, write = os.pipe()
    with os.fdopen(read) as _, os.fdopen(write, "w") as pipe:
        monkeypatch.setattr(sys, "stderr", pipe)
        monkeypatch.setattr(sys, "stdout", pipe)
        bar = _Bar()
        with caplog.at_level(logging.INFO):
            assert quiet_spark_console(_Context(bar)) is True
        assert bar.stopped == 1
        assert "Spark's console progress bar is off for this session" in caplog.text
        # A session built with spark.ui.showConsoleProgress=false has no bar to stop.
        assert quiet_spark_console(_Context(None)) is False
