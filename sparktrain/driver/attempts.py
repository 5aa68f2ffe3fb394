"""The attempts of one ``run()``: launch every rank, and launch again after a lost rank.

Each attempt has a channel and a key of its own, a Spark job group (or local supervisor) of
its own, and a :class:`~sparktrain.driver.monitor.RunMonitor` that sees it through. What
happens is kept in the run's :class:`~sparktrain.driver.run_record.RunRecord`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from typing import Any, TextIO

from sparktrain import wire
from sparktrain.config import RunConfig, conf_key
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.connect_check import ClientUnreachable
from sparktrain.driver.elastic import ResizeStop, size_note, smallest
from sparktrain.driver.inflight import (
    Line,
    StopSignal,
    forget,
    held_by_others,
    reserve,
    take_turn,
)
from sparktrain.driver.monitor import RunMonitor
from sparktrain.driver.places import Place
from sparktrain.driver.progress import Progress
from sparktrain.driver.restarts import RestartPolicy, first_line
from sparktrain.driver.result_intake import all_results, rank0_result
from sparktrain.driver.run_record import AttemptRecord, RunRecord, launch_breakdown
from sparktrain.driver.tracking import MlflowTracker
from sparktrain.errors import (
    CapacityError,
    RendezvousTimeoutError,
    RunStalledError,
    WorkerFailedError,
)
from sparktrain.log import get_logger
from sparktrain.rank_outcome import RankOutcome
from sparktrain.shipping.payload import kept_result_name
from sparktrain.task.assignment import TaskJob
from sparktrain.task.connect_stage import versions
from sparktrain.task.logs import attempt_folder

_log = get_logger(__name__)


@dataclasses.dataclass
class Attempts:
    """Runs the attempts of one ``run()`` call.

    Attributes:
        place: where the run goes (the driver's processes, a classic or a Connect session).
        config: the run's settings.
        job: what every task gets (its channel and key are filled in per attempt).
        name: the function's name, for the Spark UI.
        record: where attempts, reports and phase times are kept.
        progress: the progress display.
        tracker: MLflow tracking, when the driver has an active run.
        on_channel: private test hook, called with each attempt's channel once it listens.
        out: where the ranks' lines go (default: the driver's stdout, beside the progress).
        stop: a stop requested from another thread (a submitted run's handle).
        ticket: the run's turn among the runs of this process (taken when it was submitted;
            None: now).
        on_wait: told what the run waits for while other runs of this process hold the
            slots it needs (and None once it has them).
        frame: a run given a DataFrame: what its stage runs over (see driver.frame_input).

    ``job.all_ranks`` asks for every rank's value (a list by rank) rather than rank 0's.
    """

    place: Place
    config: RunConfig
    job: TaskJob
    name: str
    record: RunRecord
    progress: Progress
    tracker: MlflowTracker | None
    on_channel: Callable[[ChannelServer], None] | None = None
    out: TextIO | None = None
    stop: StopSignal | None = None
    ticket: int | None = None
    on_wait: Callable[[Line | None], None] | None = None
    frame: Any = None
    # The run's place among the runs of this process (see inflight.reserve), once it has one,
    # and the name of the slots it takes turns for ("" where it takes no turn).
    _token: int = dataclasses.field(default=0, init=False, repr=False)
    _application: str = dataclasses.field(default="", init=False, repr=False)

    def run(self) -> Any:
        """Launch until an attempt succeeds or may not be restarted; rank 0's value, or every
        rank's as a list by rank when ``job.all_ranks``."""
        self.record.elastic = self.config.elastic
        with self._slots() as token:
            self._token = token
            return self._run(token)

    @contextlib.contextmanager
    def _slots(self) -> Iterator[int]:
        """Hold this run's task slots against the other runs of this process, taking turns
        as the place says (see ``Place.turn``); a place without turns launches at once."""
        turn = self.place.turn()
        if turn is None:
            if self.ticket is not None:
                forget(self.ticket)  # it takes no place: the runs behind it need not wait
            if self.on_wait is not None:
                self.on_wait(None)  # nothing to wait for: it launches now
            yield 0
            return
        self._application = turn.application
        # An elastic run holds the slots of its min: beyond them it takes what is free.
        tasks = self.job.tasks
        if self.config.elastic is not None:
            tasks = smallest(self.config, self.job.ranks_per_task) // self.job.ranks_per_task
        with reserve(turn.application, tasks, self.ticket, admitted=False) as token:
            take_turn(
                turn.application,
                token,
                turn.total,
                self.config.queue_wait,
                self._refuse,
                self.stop,
                self.on_wait or self._tell_wait,
                turn.most,
            )
            yield token

    def _refuse(self, line: Line, waited: bool) -> CapacityError:
        """The error of a run that may not wait (longer) for its turn."""
        k = self.job.ranks_per_task
        n = self.job.tasks
        need = f"np={n * k}" + (f" ({n} tasks of {k} ranks, one per GPU)" if k > 1 else "")
        wait = self.config.queue_wait
        if waited:
            why = f"it did not get its turn within queue_wait={wait:g}s"
        else:
            why = f"queue_wait={wait:g} refuses to wait for them"
        lower = max(0, line.total - line.held) * k
        return CapacityError(
            f"{need} needs {n} free task slots at once, but other runs of this process still "
            f"going hold {line.held} of the cluster's {line.total} slots, and {why} "
            f"({conf_key('queue_wait')}): wait for them (handle.result()), cancel one "
            f"(handle.cancel()), raise queue_wait (none: wait as long as they take), or lower "
            f"np to {lower} or less"
        )

    def _tell_wait(self, line: Line | None) -> None:
        """A blocking run's wait for its turn, told once in the driver's log."""
        if line is not None and line.position == 1:
            _log.info("%s: %s", self.name, line)

    def _run(self, token: int) -> Any:
        base = self.config  # the run's settings; an elastic attempt's np is its own size
        job = self.job
        since: float | None = None
        restarts = RestartPolicy(base)
        previous: int | None = None
        why = "the largest size the cluster's free task slots allow"
        while True:
            if self.stop is not None and self.stop.requested:
                raise CancelledError("cancelled before its ranks were launched")
            attempt = AttemptRecord(attempt=job.attempt)
            self.record.attempts.append(attempt)
            size = self._size(base, job, attempt, token, since)
            config = self.config = self._sized(base, size)
            job = dataclasses.replace(
                job,
                config=config.to_json(),
                previous_world_size=(previous or size) if base.elastic else 0,
            )
            attempt.world_size = size
            if base.elastic is not None:
                attempt.size_reason = why
                _log.info("%s", size_note(base, size, previous, why))
                self.progress.set_ranks(size)
            try:
                return self._result(job, attempt)
            except ClientUnreachable as exc:
                # Nothing of the user's ran: the same attempt starts again, detached.
                self.place.detach(base, exc)
                self.record.attempts.remove(attempt)
                continue
            except ResizeStop as exc:
                attempt.error, attempt.cause, attempt.resized = exc, exc.reason, True
                why = exc.reason
            except (WorkerFailedError, RendezvousTimeoutError, RunStalledError) as exc:
                attempt.error, attempt.cause = exc, first_line(exc)
                why = restarts.restart(exc) or ""
                if not why:
                    raise
            except BaseException as exc:
                attempt.error, attempt.cause = exc, first_line(exc) or type(exc).__name__
                raise
            previous = size
            job = dataclasses.replace(job, attempt=job.attempt + 1)
            # Executors lost with the failed attempt get time to come back (a fixed size),
            # and the stopped attempt's tasks time to end (an elastic run counts free slots).
            since = time.time()

    def _result(self, job: TaskJob, attempt: AttemptRecord) -> Any:
        """One attempt's launch, and what the run returns if it succeeds."""
        name = kept_result_name(job.run_id, job.attempt)
        records = self._attempt(job, attempt)
        if job.all_ranks:
            return all_results(records, self.config.world_size, name, self.config.max_result_bytes)
        return rank0_result(records, name)

    def _size(
        self,
        config: RunConfig,
        job: TaskJob,
        attempt: AttemptRecord,
        token: int,
        since: float | None,
    ) -> int:
        """The next attempt's size once its task slots are free: np, or for an elastic run
        the largest in [min, max] that fits now (waiting, as np does, below min); the wait is
        the attempt's ``capacity_wait`` phase.

        Raises:
            CapacityError: too few task slots within ``capacity_wait`` (after a failed
                attempt: naming what was lost).
        """
        start = time.monotonic()
        held = held_by_others(self._application, token) if self._application else 0
        try:
            size = self.place.size(config, job, held, since)
        except CapacityError as exc:
            if job.attempt == 0:
                raise
            attempt.error = _not_back(exc, config, job.attempt, self.record)
            attempt.cause = first_line(attempt.error)
            raise attempt.error from exc
        if size is None:
            return config.world_size
        attempt.phases["capacity_wait"] = time.monotonic() - start
        return size

    @staticmethod
    def _sized(config: RunConfig, size: int) -> RunConfig:
        """The settings of an attempt of ``size`` ranks (every size-derived value follows)."""
        if config.elastic is None or config.np == size:
            return config
        return dataclasses.replace(config, np=size)

    def _grow_watch(self, job: TaskJob) -> Callable[[int], ResizeStop | None] | None:
        """What the attempt's monitor asks when rank 0 saves a checkpoint: whether an elastic
        run below max stops there to grow (None where it never does)."""
        application, token = self._application, self._token
        return self.place.grow_watch(self.config, job, lambda: held_by_others(application, token))

    def _on_report(self, message: dict[str, Any]) -> None:
        self.record.add_report(message)
        self.progress.on_report(message)
        if self.tracker is not None:
            self.tracker.on_report(message)

    def _attempt(self, job: TaskJob, attempt: AttemptRecord) -> list[RankOutcome]:
        """One launch of every rank, with a channel of its own."""
        key = wire.new_key()
        bind, advertise = self.place.channel_address()
        with ChannelServer(
            key, bind=bind, advertise=advertise, world_size=self.config.world_size
        ) as server:
            detached = self.place.detached
            # Until a stage of the place has, the tasks check the executors' versions and
            # whether they reach the client (see connect_check).
            checking = self.place.checking
            # Detached tasks get no channel: they learn the layout from Spark's barrier.
            job = dataclasses.replace(
                job,
                channel="" if detached else server.address,
                key=key,
                client_versions=versions() if checking else None,
            )
            if detached:
                _log.warning("%s", _detached_note(self.config, job))
            if self.on_channel is not None:
                self.on_channel(server)
            description = f"sparktrain: {self.name} on {self.config.world_size} ranks"
            if job.attempt:
                description += f" (attempt {job.attempt + 1})"
            monitor = RunMonitor(
                self.config,
                server,
                out=self.out or self.progress.wrap(sys.stdout),
                on_report=self._on_report,
                kept_name=kept_result_name(job.run_id, job.attempt),
                all_ranks=job.all_ranks,
                on_saved=self._grow_watch(job),
            )
            stop = self.stop.attached(server.events) if self.stop else contextlib.nullcontext()
            launch = self.place.launch(job, description, self.frame)
            try:
                with stop:
                    records = monitor.watch(launch)
                self._checked(checking)
                return records
            except (KeyboardInterrupt, CancelledError):
                raise
            except Exception as exc:
                stage_error = getattr(launch, "stage_error", None)
                verdict = self.place.verdict(stage_error) if checking else None
                if verdict is not None:
                    raise verdict from exc
                if monitor.arrived:
                    self._checked(checking)  # the tasks passed the checks and said hello
                # Stopped to grow: however each rank ended (returned at should_stop(), or
                # killed by the stop), the run goes on larger from the checkpoint.
                if isinstance(monitor.stop_error, ResizeStop) and exc is not monitor.stop_error:
                    raise monitor.stop_error from exc
                raise
            finally:
                attempt.phases.update(monitor.phases())
                attempt.breakdown = launch_breakdown(
                    monitor.rank0_times, attempt.phases.get("training")
                )

    def _checked(self, checking: bool) -> None:
        """The place's runs need not check again: a stage passed the checks."""
        if checking:
            self.place.passed_checks()


def _detached_note(config: RunConfig, job: TaskJob) -> str:
    """What a user sees of a run whose executors cannot reach this client."""
    if config.log_dir is None:
        where = f"set {conf_key('log_dir')} (log_dir=) to a shared folder to keep it"
    else:
        where = f"it is written to {config.log_dir}/{job.run_id}/{attempt_folder(job.attempt)}/"
    return (
        "the executors cannot reach this client: no live output or progress from the ranks "
        f"({where}); the result, and a failed rank's error and last lines, come back with "
        "the Spark job"
    )


def _not_back(
    error: CapacityError, config: RunConfig, attempt: int, record: RunRecord
) -> CapacityError:
    """The error of a restart that found too few executors: what was lost, and how long it
    waited for them to come back (a lost host's executors return only when the cluster
    replaces the host or restarts its worker)."""
    previous = record.attempts[-2].cause if len(record.attempts) > 1 else None
    return CapacityError(
        f"attempt {attempt + 1}/{config.max_restarts + 1} could not start: the executors lost "
        f"with attempt {attempt} ({previous or 'its failure'}) did not come back within "
        f"capacity_wait={config.capacity_wait:g}s ({conf_key('capacity_wait')}). {error} "
        "Raise capacity_wait to wait longer for the cluster to replace them."
    )
