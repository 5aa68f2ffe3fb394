"""How a watched run ends: the ranks' records when it went well, otherwise what stopped it
(the failed ranks first, with where the others were stopped), raised.

:class:`RunOutcome` is the part of :class:`~sparktrain.driver.monitor.RunMonitor` that reads
what the watch saw once it is over; the monitor sets the attributes it declares.
"""

from __future__ import annotations

from concurrent.futures import CancelledError
from typing import Any

from sparktrain.driver.elastic import ResizeStop
from sparktrain.driver.failures import job_failure
from sparktrain.driver.launch import Launch
from sparktrain.driver.result_intake import ResultReceiver
from sparktrain.errors import (
    RunTimeoutError,
    SparkTrainError,
    WorkerFailedError,
    WorkerFailure,
    describe_stopped,
)
from sparktrain.log import get_logger
from sparktrain.rank_outcome import RankOutcome, RankStatus

_log = get_logger(__name__)


class RunOutcome:
    """What a run returns or raises, from what its monitor saw."""

    stop_reason: str | None
    stop_error: SparkTrainError | None
    stop_asked: bool
    failures: dict[int, WorkerFailure]
    stopped: dict[int, WorkerFailure]
    started: dict[int, dict[str, Any]]
    infos: dict[int, dict[str, Any]]
    rank_of: dict[int, int]
    results: ResultReceiver
    kept_name: str | None
    rank0_times: dict[str, Any] | None
    times: dict[str, float]

    def phases(self) -> dict[str, float]:
        """Seconds from launch to the first hello (``submit``), to every task's
        (``rendezvous``), to the launch's end (``training``) and to the monitor's
        (``teardown``); phases never reached are left out."""
        marks = [("submit", "hello"), ("rendezvous", "go"), ("training", "done")]
        spent: dict[str, float] = {}
        last = self.times.get("start")
        for phase, mark in marks:
            if last is None or mark not in self.times:
                break
            spent[phase] = self.times[mark] - last
            last = self.times[mark]
        if "done" in self.times and "end" in self.times:
            spent["teardown"] = self.times["end"] - self.times["done"]
        return spent

    def _end(
        self, done: dict[str, Any] | None, launch: Launch, interrupted: bool
    ) -> list[RankOutcome]:
        """The records of a run that went well; otherwise what stopped it, raised."""
        if interrupted or self.stop_asked:
            self._keep_results(say=True)
        if interrupted:
            self._collect_stopped(done)
            if self.stopped:
                report = describe_stopped(self.stopped)
                raise KeyboardInterrupt(f"interrupted; every rank was stopped.\n\n{report}")
            raise KeyboardInterrupt
        if self.stop_asked:
            self._collect_stopped(done)
            note = f"\n\n{describe_stopped(self.stopped)}" if self.stopped else ""
            raise CancelledError(f"cancelled; every rank was stopped.{note}")
        assert done is not None  # the loop ends otherwise only on an interrupt
        return self._conclude(done, launch)

    def _failed(self, failure: WorkerFailure) -> bool:
        """Count ``failure``; False when it only followed a stop for a deadline, a stall or
        an interrupt (its collective lost a peer that was stopped): it then counts as stopped."""
        stopping = self.stop_reason is not None and not isinstance(
            self.stop_error, WorkerFailedError
        )
        if stopping and failure.follows_peer_loss:
            self.stopped.setdefault(failure.rank, failure)
            return False
        self.failures.setdefault(failure.rank, failure)
        return True

    def _collect_stopped(self, done: dict[str, Any] | None) -> None:
        """Take the stopped ranks' stacks from the records too (they may come either way)."""
        for data in (done or {}).get("records") or ():
            try:
                record = RankOutcome.from_json(data)
            except (TypeError, ValueError):
                continue
            if record.status is RankStatus.STOPPED and record.failure is not None:
                self.stopped.setdefault(record.failure.rank, record.failure)

    def _keep_results(self, say: bool = False) -> str:
        """Keep the results that reached the driver of a run that returns none of them (a rank
        that finished as another failed, or as the run was stopped); what the error says of
        them (empty when none arrived), or with ``say``, a warning says it."""
        if self.kept_name is None:
            return ""
        kept = self.results.keep(self.rank_of, self.kept_name)
        if kept and say:
            _log.warning("the run returns no value%s", kept)
        return kept

    def _conclude(self, done: dict[str, Any], launch: Launch) -> list[RankOutcome]:
        # The records as they crossed from the tasks, typed once here.
        records = [RankOutcome.from_json(r) for r in done.get("records") or ()]
        self.rank0_times = next((r.times for r in records if r.rank == 0), None)
        self.results.attach(records)
        for record in records:
            if record.status is RankStatus.FAILED and record.failure is not None:
                self._failed(record.failure)
        self._collect_stopped(done)
        if self.failures:
            kept = self._keep_results()
            raise WorkerFailedError(self.failures, kept, stopped=self.stopped)
        # Stopped to grow, the run goes on larger and returns that attempt's value.
        resizing = isinstance(self.stop_error, ResizeStop)
        if not resizing and (self.stop_error is not None or done.get("error") is not None):
            self._keep_results(say=True)
        if isinstance(self.stop_error, RunTimeoutError):
            # Raised with where every rank was, which is known only now.
            raise type(self.stop_error)(self.stop_error.reason, self.stopped)
        if self.stop_error is not None:
            raise self.stop_error
        error = done.get("error")
        if error is not None:
            failure = job_failure(
                launch.describe_error(error), launch.failed_task(error), self.started, self.infos
            )
            raise WorkerFailedError({failure.rank: failure}) from error
        return records
