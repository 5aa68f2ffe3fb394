"""One call of ``run()`` / ``run_all()`` once the runner has its arguments and its place:
the checks that cost nothing, the pickled call, then its attempts (see
:class:`~sparktrain.driver.attempts.Attempts`) with the progress bar, MLflow tracking and, for a
submitted run, the handle's output and stop."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from sparktrain.config import RunConfig
from sparktrain.driver.attempts import Attempts
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.frame_input import frame_source, stage_frame
from sparktrain.driver.handle import RunHandle
from sparktrain.driver.interrupt import plain_ctrl_c
from sparktrain.driver.places import Place
from sparktrain.driver.preflight import check_run
from sparktrain.driver.progress import Progress
from sparktrain.driver.run_record import RunRecord
from sparktrain.driver.tracking import MlflowTracker
from sparktrain.shipping.local_modules import scope_of
from sparktrain.shipping.payload import dump_call, dumps
from sparktrain.task.assignment import TaskJob


@dataclasses.dataclass(frozen=True)
class Call:
    """What one call runs.

    Attributes:
        name: the function's (or script's) name, for the Spark UI and messages.
        fn: the function (``run_script`` for a script).
        args: its positional arguments (a script's ``[path, source, args]``).
        kwargs: its keyword arguments.
        all_ranks: every rank's value comes back (``run_all``), not rank 0's alone.
        script: the script's arguments as ``args`` holds them, or None for a function.
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    all_ranks: bool
    script: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Display:
    """What the runner shows and keeps beside the run (its constructor's options).

    Attributes:
        progress: show a progress bar (never for a submitted run).
        total_epochs: the epochs the bar counts, if known.
        checkpoint_dir: logged to MLflow at the end of a tracked run that succeeded.
        on_channel: private test hook, called with each attempt's channel once it listens.
    """

    progress: bool = True
    total_epochs: int | None = None
    checkpoint_dir: str | None = None
    on_channel: Callable[[ChannelServer], None] | None = None


@dataclasses.dataclass
class Prepared:
    """A call checked and pickled, ready for its first attempt."""

    place: Place
    config: RunConfig
    job: TaskJob
    name: str
    frame: Any


def prepare(place: Place, config: RunConfig, conf: Any, call: Call, hook: bytes | None) -> Prepared:
    """Every check that costs nothing, then the pickled call and the place's own preparation.

    Args:
        place: where the run goes.
        config: the run's settings, resolved with the place's conf.
        conf: the place's conf as read for this call (None on the driver).
        call: what runs.
        hook: the pickled pre-rendezvous test hook, if any.
    """
    source = frame_source(call.args, call.kwargs)  # a DataFrame the ranks read (at most one)
    check_run(config, call.all_ranks)
    per_task = place.check(config, conf)
    tasks = config.world_size // per_task
    frame = None if source is None else stage_frame(source, place, config, tasks)
    modules = scope_of(config.ship_modules, config.max_module_bytes, call.script)
    payload = dump_call(call.fn, call.args, call.kwargs, config.max_payload_bytes, modules)
    place.prepare(config, per_task)
    job = TaskJob(
        run_id=uuid.uuid4().hex[:12],
        attempt=0,
        config=config.to_json(),
        channel="",
        key=b"",
        payload=payload,
        hook=hook,
        ranks_per_task=per_task,
        all_ranks=call.all_ranks,
        stream_window=source.window if source is not None else 0,
        stream_rows=source.batch_size if source is not None else 0,
    )
    return Prepared(place, config, job, call.name, frame)


def pickled_hook(hook: Callable[[int], None] | None) -> bytes | None:
    """The pre-rendezvous test hook as the ranks get it."""
    return None if hook is None else dumps(hook)


def execute(run: Prepared, record: RunRecord, display: Display, handle: RunHandle | None) -> Any:
    """Run the prepared call's attempts; rank 0's value, or every rank's.

    Args:
        run: the prepared call.
        record: where its attempts, reports and phases are kept.
        display: the progress bar and tracking options.
        handle: a submitted run's handle (its output, stop and place in line), or None.
    """
    if handle is not None:
        handle.record = record
    progress = Progress(
        total=display.total_epochs,
        unit="epoch" if display.total_epochs else "report",
        display=display.progress and handle is None,
    )
    tracker = MlflowTracker.maybe_create()
    submitted: dict[str, Any] = {}
    if handle is not None:  # its output, stop and place in line go through the handle
        submitted = {
            "out": handle.output,
            "stop": handle.stop,
            "ticket": handle.ticket,
            "on_wait": handle._set_waiting,
        }
    attempts = Attempts(
        run.place,
        run.config,
        run.job,
        run.name,
        record,
        progress,
        tracker,
        display.on_channel,
        frame=run.frame,
        **submitted,
    )
    try:
        with plain_ctrl_c():
            return attempts.run()
    finally:
        record.finished = time.time()
        progress.close()
        if tracker is not None:
            tracker.finish(display.checkpoint_dir if record.succeeded else None)
