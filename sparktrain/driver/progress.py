"""A live progress bar on the driver, fed by ``sparktrain.report`` messages.

The bar (``tqdm.auto``: a widget in notebooks, a text bar in terminals) appears on the first
report of rank 0, so runs that never call ``report`` look exactly as before. Its postfix shows
rank 0's latest epoch, step and metrics. Where tqdm is missing, or output goes to a file or a
log rather than a terminal, each update is one plain line instead, at most every
``plain_interval`` seconds.

Example:
    >>> progress = Progress(total=10, unit="epoch")
    >>> progress.on_report({"type": "report", "rank": 0, "step": 99, "epoch": 0,
    ...                     "metrics": {"loss": 0.31}})
    >>> progress.close()

The reports themselves are kept by the run's record (``runner.last_run.reports``).
"""

from __future__ import annotations

import importlib.util
import sys
import time
import warnings
from collections.abc import Mapping
from typing import Any, TextIO

UNITS = ("report", "step", "epoch")
# Row fields set by the driver; a metric with one of these names is stored as ``<name>_``.
FIELDS = ("rank", "step", "epoch", "time")


class Progress:
    """Shows rank 0's reports as a progress bar; :attr:`latest` is rank 0's newest row.

    Never raises from :meth:`on_report`: a display error becomes one warning.

    Args:
        total: how many ``unit`` make the whole run, when known (see :meth:`set_total`).
        unit: what the bar counts: ``"report"`` (each report of rank 0), ``"epoch"`` or
            ``"step"``. Epochs and steps are taken as 0-based and reported once done, as in
            ``for epoch in range(total): ...; report(epoch=epoch, ...)``: a report of epoch
            ``e`` puts the bar at ``e + 1``.
        file: the stream for the bar; given, a text tqdm bar always goes there. By default
            tqdm.auto picks a notebook widget or stderr, and falls back to plain lines when
            stderr is not a terminal.
        display: False shows nothing.
        desc: the bar's label.
        plain_interval: seconds between two plain lines (the first and last always show).
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        unit: str = "report",
        file: TextIO | None = None,
        display: bool = True,
        desc: str = "sparktrain",
        plain_interval: float = 10.0,
    ) -> None:
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}; got {unit!r}")
        self.total, self.unit, self.file = total, unit, file
        self.display, self.desc, self.plain_interval = display, desc, plain_interval
        self.latest: dict[str, Any] | None = None  # rank 0's newest row
        # The attempt's number of ranks, shown beside the metrics (an elastic run's changes).
        self.ranks: int | None = None
        self._reports = 0  # rank 0's reports so far
        self._bar: Any = None
        self._tqdm: Any = None  # the bar's class, for tqdm.write
        self._plain = False
        self._started = False
        self._closed = False
        self._broken = False
        self._last_plain = 0.0
        self._plain_pending = False

    # -- feeding --------------------------------------------------------------------------

    def on_report(self, message: Mapping[str, Any]) -> None:
        """Show one ``{"type": "report", "rank", "step", "epoch", "metrics"}`` message."""
        row = self._row(message)
        if row["rank"] == 0:
            self.latest = row
            self._reports += 1
        if row["rank"] != 0 or not self.display or self._closed or self._broken:
            return
        try:
            self._show()
        except Exception as exc:  # noqa: BLE001 - a display problem must never stop training
            self._broken = True
            warnings.warn(
                f"sparktrain: the progress display failed and is off for this run "
                f"({type(exc).__name__}: {exc})",
                RuntimeWarning,
                stacklevel=2,
            )

    def set_total(self, total: int | None, unit: str | None = None) -> None:
        """Set (or change) how many ``unit`` the whole run takes; an open bar follows.

        Args:
            total: the total, or None for a bar without one.
            unit: a new unit (``"report"``, ``"epoch"`` or ``"step"``), or None to keep it.
        """
        if unit is not None and unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}; got {unit!r}")
        self.total = total
        if unit is not None:
            self.unit = unit
        if self._bar is not None and not self._broken:
            try:
                self._bar.total = total
                self._bar.unit = self.unit
                self._bar.n = self._position(self._bar.n)
                self._bar.refresh()
            except Exception:  # noqa: BLE001 - cosmetic
                pass

    def set_ranks(self, ranks: int) -> None:
        """Show the attempt's number of ranks (``ranks=N``) from the next report on: an
        elastic run's size, which may change between attempts."""
        self.ranks = ranks

    def close(self) -> None:
        """Finish the bar (or print the last plain line); later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._bar is not None:
                self._bar.set_postfix(self._postfix(), refresh=False)
                self._bar.close()
            elif self._plain and self._plain_pending:
                self._print_plain()
        except Exception:  # noqa: BLE001 - closing a display must not mask the run's outcome
            pass

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------

    def wrap(self, out: TextIO) -> TextIO:
        """A stream that writes to ``out`` without breaking the bar (for log lines).

        Example:
            >>> RunMonitor(config, server, out=progress.wrap(sys.stdout), ...)
        """
        return _BarSafeStream(self, out)  # type: ignore[return-value]

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _row(message: Mapping[str, Any]) -> dict[str, Any]:
        rank = message.get("rank")
        row: dict[str, Any] = {
            "rank": rank if isinstance(rank, int) else -1,
            "step": message.get("step"),
            "epoch": message.get("epoch"),
        }
        metrics = message.get("metrics")
        if isinstance(metrics, Mapping):
            for name, value in metrics.items():
                row[f"{name}_" if name in FIELDS else str(name)] = value
        row["time"] = time.time()
        return row

    def _position(self, current: int) -> int:
        row = self.latest
        if self.unit == "report":
            return self._reports
        value = None if row is None else row.get(self.unit)
        return int(value) + 1 if isinstance(value, int) else current

    def _postfix(self) -> dict[str, Any]:
        row = self.latest or {}
        shown = {"ranks": self.ranks, "epoch": row.get("epoch"), "step": row.get("step")}
        shown.update((k, v) for k, v in row.items() if k not in FIELDS)
        return {k: v for k, v in shown.items() if v is not None}

    def _show(self) -> None:
        if not self._started:
            self._started = True
            self._start()
        if self._plain:
            self._plain_pending = True
            if time.monotonic() - self._last_plain >= self.plain_interval or (
                self._last_plain == 0.0
            ):
                self._print_plain()
            return
        bar = self._bar
        position = self._position(bar.n)
        bar.set_postfix(self._postfix(), refresh=False)
        if position >= bar.n:
            bar.update(position - bar.n)  # redraws at most every mininterval
        else:  # a restarted attempt reports from an earlier point
            bar.n = position
            bar.refresh()

    def _start(self) -> None:
        """Create the display on rank 0's first report: a tqdm bar, or plain lines."""
        cls: Any = None
        try:
            if self.file is not None:
                from tqdm import std

                cls = std.tqdm
            elif _kernel_without_widgets():
                from tqdm import std

                cls = std.tqdm
            else:
                from tqdm.auto import tqdm as auto

                in_notebook = any("notebook" in c.__module__ for c in auto.__mro__)
                if in_notebook or _isatty(sys.stderr):
                    cls = auto
        except ImportError:
            cls = None
        if cls is None:
            self._plain = True
            return
        options = {
            "total": self.total,
            "unit": self.unit,
            "desc": self.desc,
            "file": self.file,
            "dynamic_ncols": True,
            "leave": True,
        }
        try:
            self._bar = cls(**options)
        except ImportError:  # a notebook without ipywidgets: a text bar still renders there
            from tqdm import std

            cls = std.tqdm
            self._bar = cls(**options)
        self._tqdm = cls

    def _print_plain(self) -> None:
        self._last_plain = time.monotonic()
        self._plain_pending = False
        parts = [f"{k}={_fmt(v)}" for k, v in self._postfix().items()]
        done = self._position(0)
        if self.total:
            parts.insert(0, f"{done}/{self.total} {self.unit}s")
        stream = self.file or sys.stderr
        try:
            print(f"{self.desc}: " + " ".join(parts), file=stream, flush=True)
        except (OSError, ValueError):
            pass

    def _write(self, text: str, out: TextIO) -> None:
        if self._bar is not None and not self._closed and not self._broken:
            self._tqdm.write(text, file=out)
        else:
            out.write(text + "\n")


class _BarSafeStream:
    """Line-buffered writer that prints whole lines above the bar via ``tqdm.write``."""

    def __init__(self, progress: Progress, out: TextIO) -> None:
        self._progress = progress
        self._out = out
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._progress._write(line, self._out)
        return len(text)

    def flush(self) -> None:
        if self._partial:
            line, self._partial = self._partial, ""
            self._progress._write(line, self._out)
        self._out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _kernel_without_widgets() -> bool:
    """Whether this is a Jupyter kernel without ipywidgets: tqdm's widget cannot show there, and
    importing ``tqdm.auto`` warns "IProgress not found"; tqdm's text bar renders in a notebook
    cell as well."""
    return "ipykernel.zmqshell" in sys.modules and importlib.util.find_spec("ipywidgets") is None


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def quiet_spark_console(sc: Any) -> bool:
    """Stop Spark's console progress bar (``[Stage N:>   (0 + 2) / 2]``) of ``sc``: it would be
    drawn in front of the ranks' lines and over a run's progress.

    Spark draws its bar on the JVM's stderr with a carriage return and no newline, and the
    next line printed after it (a ``[rank N]`` line, on the driver's stdout) is glued to it
    wherever both end up together: a terminal, ``2>&1 | tee train.log``, or a notebook's
    cell (a Jupyter kernel passes its subprocesses' output to the cell). Spark reads
    ``spark.ui.showConsoleProgress`` only when the context starts, and its bar has no pause:
    it is stopped for the rest of the session, and a log line says so once.

    Args:
        sc: the SparkContext (a classic session's; Spark Connect's have no bar here).

    Returns:
        Whether a bar was stopped now.
    """
    try:
        option = sc._jsc.sc().progressBar()
        if not option.isDefined():
            return False
        option.get().stop()
    except Exception:  # noqa: BLE001 - a display nicety: never fail a run over it
        return False
    from sparktrain.log import get_logger

    get_logger(__name__).info(
        "Spark's console progress bar is off for this session: it draws in front of the "
        "ranks' lines (spark.ui.showConsoleProgress=false when the session is built keeps it "
        "from starting)"
    )
    return True
