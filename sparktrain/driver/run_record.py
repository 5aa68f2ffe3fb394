"""The record of one ``run()``: its attempts, what the ranks reported, and where time went.

Example:
    >>> runner = SparkRunner(np=2)
    >>> runner.run(train)
    >>> record = runner.last_run
    >>> record.phases                  # seconds per phase, over every attempt
    {'capacity_wait': 0.01, 'submit': 0.21, 'rendezvous': 0.05, 'training': 3.9, 'teardown': 0.1}
    >>> record.attempts[0].cause       # None: the first attempt succeeded
    >>> record.frame()                 # every rank's reports as a DataFrame
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

# The phases of one attempt, in order (see AttemptRecord.phases).
PHASES = ("capacity_wait", "submit", "rendezvous", "training", "teardown")
# Where rank 0's part of ``training`` went, in order (see launch_breakdown).
BREAKDOWN = ("prepare", "start", "load", "function", "result", "return")
# Each step of BREAKDOWN but the last: from which timestamp of the rank to which.
_STEPS = (
    ("prepare", "go", "spawned"),
    ("start", "spawned", "begun"),
    ("load", "begun", "called"),
    ("function", "called", "returned"),
    ("result", "returned", "written"),
)


def launch_breakdown(
    times: Mapping[str, Any] | None, training: float | None
) -> dict[str, float | bool]:
    """Where rank 0's part of an attempt's ``training`` phase went, in seconds.

    ``prepare``: from the task's "go" to asking for the rank's process (a backend's rendezvous
    server); ``start``: until the rank's code began (a new interpreter and its imports, or a
    fork from a warm zygote: ``forked``); ``load``: loading the function and pinning the
    device; ``function``: the user's function; ``result``: pickling and writing its value;
    ``return``: the rest of ``training``, the way back to the driver. Durations on one host's
    clock, so hosts' clocks need not agree.

    Args:
        times: rank 0's timestamps (see sparktrain.task.rank_outcomes.launch_times), or None.
        training: the attempt's ``training`` phase, seconds, if it has one.
    """
    if not times:
        return {}
    spent: dict[str, float | bool] = {"forked": bool(times.get("forked"))}
    for name, start, end in _STEPS:
        if times.get(start) is not None and times.get(end) is not None:
            spent[name] = max(0.0, float(times[end]) - float(times[start]))
    if training is not None and times.get("go") is not None and times.get("written"):
        spent["return"] = max(0.0, training - (float(times["written"]) - float(times["go"])))
    return spent


class Text(str):
    """Text for people: a ``str`` that a REPL or a notebook shows as it reads, not escaped."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's display: the text, lines and all."""
        printer.text(str(self))


@dataclasses.dataclass
class AttemptRecord:
    """One launch of every rank.

    Attributes:
        attempt: 0 for the first launch, then one more per restart.
        phases: seconds spent in each phase: ``capacity_wait`` (waiting for task slots),
            ``submit`` (launch until the first task said hello), ``rendezvous`` (until every
            task had), ``training`` (until the launch ended) and ``teardown`` (until every
            task had confirmed its end). A phase the attempt never reached is absent.
        error: why it failed, or None when it succeeded.
        cause: the first line of ``error``: the root cause.
        breakdown: where rank 0's part of ``training`` went (see :func:`launch_breakdown`);
            empty when rank 0 did not return.
        world_size: how many ranks it launched (None until its size was chosen).
        size_reason: why it has that size: for an elastic run (``np=(min, max)``), what the
            cluster's free task slots allowed and why the size changed; None otherwise.
        resized: its ranks were stopped after a checkpoint to launch the run larger (an
            elastic run growing back); such an attempt does not count against
            ``max_restarts``.
    """

    attempt: int
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    error: BaseException | None = None
    cause: str | None = None
    breakdown: dict[str, float | bool] = dataclasses.field(default_factory=dict)
    world_size: int | None = None
    size_reason: str | None = None
    resized: bool = False


@dataclasses.dataclass
class RunRecord:
    """Everything the driver learnt in one ``run()`` besides rank 0's value.

    Attributes:
        attempts: every launch, in order (more than one only with ``max_restarts``).
        reports: every ``sparktrain.report`` of every rank and attempt, as received, with the
            driver's receive ``time`` added.
        started: when ``run()`` was called (wall clock).
        finished: when it returned or raised; None while it runs.
        elastic: an elastic run's ``(min, max)`` (``np=(min, max)``); None for a fixed size.
    """

    attempts: list[AttemptRecord] = dataclasses.field(default_factory=list)
    reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.time)
    finished: float | None = None
    elastic: tuple[int, int] | None = None

    def add_report(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Keep one report message; returns the kept row."""
        row = {**message, "time": time.time()}
        self.reports.append(row)
        return row

    @property
    def phases(self) -> dict[str, float]:
        """Seconds per phase, summed over the attempts, in :data:`PHASES` order."""
        total: dict[str, float] = {}
        for phase in PHASES:
            spent = [a.phases[phase] for a in self.attempts if phase in a.phases]
            if spent:
                total[phase] = sum(spent)
        return total

    @property
    def sizes(self) -> list[int]:
        """Each attempt's number of ranks, in order (those whose size was chosen)."""
        return [a.world_size for a in self.attempts if a.world_size is not None]

    @property
    def succeeded(self) -> bool:
        """Whether the last attempt succeeded."""
        return bool(self.attempts) and self.attempts[-1].error is None

    def frame(self) -> Any:
        """The reports as a pandas DataFrame: rank, step, epoch, then one column per metric."""
        from sparktrain.plot import history_frame

        return history_frame(self.reports)

    def describe(self) -> Text:
        """A short table of the attempts and their phases, for people.

        A ``str`` whose repr is the text itself, so a REPL or a notebook shows the table
        rather than an escaped one-line string.
        """
        lines = []
        for a in self.attempts:
            spent = ", ".join(f"{p} {a.phases[p]:.2f}s" for p in PHASES if p in a.phases)
            if a.resized:
                outcome = f"resized: {a.cause}"
            else:
                outcome = "ok" if a.error is None else f"failed: {a.cause}"
            ranks = "rank" if a.world_size == 1 else "ranks"
            size = "" if a.world_size is None else f" on {a.world_size} {ranks}"
            lines.append(f"attempt {a.attempt + 1}{size}: {outcome} ({spent})")
            if a.size_reason:
                lines.append(f"  size: {a.size_reason}")
            steps = ", ".join(f"{s} {a.breakdown[s]:.2f}s" for s in BREAKDOWN if s in a.breakdown)
            if steps:
                how = "forked warm" if a.breakdown.get("forked") else "new interpreter"
                lines.append(f"  rank 0 ({how}): {steps}")
        return Text("\n".join(lines))
