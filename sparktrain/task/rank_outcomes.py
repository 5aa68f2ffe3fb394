"""Task records: what each rank left behind, turned into the record its task yields.

A rank leaves its exit code, its last lines of output and, in the task's own folder,
``error-<rank>.json`` when it failed in Python or ``result.pkl`` (rank 0) when it succeeded
(see :mod:`sparktrain.worker.bootstrap`). A record is a
:class:`~sparktrain.rank_outcome.RankOutcome`: its ``status``, ``result`` (rank 0's pickled
value, or every rank's for ``run_all``) and ``failure`` (for a rank that was stopped while
running, phase "stopped" with where its main thread was, its stack and its last output).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sparktrain import contract, stacks
from sparktrain.errors import WorkerFailure
from sparktrain.layout.cluster import ClusterSpec, RankSpec
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.task.process import TAIL_LINES

NO_STACK = "its stack could not be read (it had not started the function, or did not answer)"

NO_RESULT = "the process exited with code 0 but wrote no result (did the function call os._exit?)"


def error_file(workdir: Path, rank: int) -> Path:
    """Where ``rank`` writes its error record when it fails in Python."""
    return workdir / contract.error_file_name(rank)


def record(
    rank: RankSpec,
    status: RankStatus,
    result: bytes | None = None,
    failure: WorkerFailure | None = None,
) -> RankOutcome:
    """A task record, as the driver collects them."""
    return RankOutcome(rank.task.index, rank.rank, status, result, failure)


def clip(lines: Iterable[Any], n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines, each cut to a sane length (they travel in messages)."""
    return [str(line)[:2000] for line in list(lines)[-n:]]


def read_errors(workdir: Path, ranks: Iterable[RankSpec]) -> dict[int, dict[str, Any]]:
    """The error records that ``ranks`` wrote in ``workdir``, by rank."""
    errors = {}
    for rank in ranks:
        path = error_file(workdir, rank.rank)
        if path.exists():
            errors[rank.rank] = json.loads(path.read_text(encoding="utf-8"))
    return errors


def _from_error(data: Mapping[str, Any], base: WorkerFailure) -> WorkerFailure:
    """``base`` completed with what the rank wrote about its own failure."""
    return dataclasses.replace(
        base,
        exc_type=data.get("exc_type"),
        message=data.get("message", ""),
        traceback=data.get("traceback"),
        phase=data.get("phase", "run"),
        user_error=bool(data.get("user_error")),
        time=float(data.get("time", base.time)),
    )


def with_stack(base: WorkerFailure, stack: stacks.Stack | None) -> WorkerFailure:
    """``base`` with where the rank's main thread was and its stack (see :mod:`sparktrain.stacks`),
    or a note that there is none."""
    if stack is None:
        return dataclasses.replace(base, message=NO_STACK)
    return dataclasses.replace(base, where=stacks.where(stack), stack=stacks.render(stack))


def _exited_cleanly(
    rank: RankSpec, workdir: Path, base: WorkerFailure, returns: bool = False
) -> RankOutcome:
    """The record of a rank that exited 0: ok, unless it wrote no result where one is asked
    for (rank 0's always; every rank's when ``returns``)."""
    if rank.rank != 0 and not returns:
        return record(rank, RankStatus.OK)
    result = workdir / contract.result_file_name(rank.rank)
    if not result.exists():
        return record(rank, RankStatus.FAILED, failure=dataclasses.replace(base, message=NO_RESULT))
    return record(rank, RankStatus.OK, result.read_bytes())


def rank_record(
    rank: RankSpec,
    workdir: Path,
    code: int,
    output_tail: Iterable[str],
    end: float,
    stopped: bool,
    stack: stacks.Stack | None = None,
    returns: bool = False,
) -> RankOutcome:
    """The record of one rank that ran as its own process (the torch path).

    Args:
        rank: the rank.
        workdir: the folder it wrote its error or result file in.
        code: its exit code (negative: killed by that signal).
        output_tail: its last lines of output.
        end: when it ended (wall clock).
        stopped: whether the supervisor stopped it; unless it wrote an error record of its
            own, its end is then no failure.
        stack: its main thread's stack, dumped before it was stopped.
        returns: every rank's value is asked for, not rank 0's alone (``run_all``).
    """
    base = WorkerFailure(
        rank=rank.rank,
        host=rank.task.host,
        exit_code=code,
        output_tail=tuple(output_tail),
        time=end,
        phase="lost",
    )
    data = read_errors(workdir, [rank]).get(rank.rank)
    if data is not None:
        rec = record(rank, RankStatus.FAILED, failure=_from_error(data, base))
    elif code != 0:
        rec = record(rank, RankStatus.FAILED, failure=base)
    else:
        rec = _exited_cleanly(rank, workdir, base, returns)
    if stopped and rec.status is RankStatus.FAILED and data is None:
        # Ended by our signal. A rank that wrote its own error record failed by itself,
        # even if the stop arrived while it was exiting; its time decides the root cause.
        stopped_here = with_stack(dataclasses.replace(base, phase="stopped"), stack)
        rec = dataclasses.replace(rec, status=RankStatus.STOPPED, failure=stopped_here)
    return rec


def mpi_records(
    spec: ClusterSpec,
    workdir: Path,
    *,
    code: int,
    stopped: bool,
    end: float,
    exits: Mapping[int, int],
    errors: Mapping[int, Mapping[str, Any]],
    tails: Mapping[int, Iterable[str]],
    launcher_output: Iterable[str],
) -> list[RankOutcome]:
    """Every rank's record once mpirun has ended.

    Args:
        spec: the job's layout.
        workdir: the launcher's folder (rank 0 writes its result there).
        code: mpirun's exit code.
        stopped: whether the supervisor stopped mpirun (failures then are no root cause).
        end: when mpirun ended (wall clock).
        exits: the ranks mpirun reported as ended abnormally, with their exit codes.
        errors: the error records the ranks wrote, from every host.
        tails: each rank's last lines of output.
        launcher_output: mpirun's and the daemons' own output, for when mpirun itself failed.
    """
    records = []
    for rank in spec.ranks:
        base = WorkerFailure(
            rank=rank.rank,
            host=rank.task.host,
            exit_code=exits.get(rank.rank, code),
            output_tail=tuple(tails.get(rank.rank, ())),
            time=end,
            phase="lost",
        )
        data = errors.get(rank.rank)
        if data is not None:
            base = dataclasses.replace(base, exit_code=exits.get(rank.rank, 1))
            rec = record(rank, RankStatus.FAILED, failure=_from_error(data, base))
        elif rank.rank in exits:
            rec = record(rank, RankStatus.FAILED, failure=base)
        elif code == 0:
            rec = _exited_cleanly(rank, workdir, base)
        else:
            rec = record(rank, RankStatus.STOPPED)
        if stopped and rec.status is RankStatus.FAILED and data is None:
            rec = dataclasses.replace(rec, status=RankStatus.STOPPED)
        records.append(rec)
    if code != 0 and not stopped and not any(r.status is RankStatus.FAILED for r in records):
        # mpirun itself failed (a daemon did not start, a bad host...): say so on rank 0.
        first = spec.first
        failure = WorkerFailure(
            rank=first.rank,
            host=first.task.host,
            exit_code=code,
            phase="lost",
            message=f"mpirun exited with code {code} (its output follows)",
            output_tail=tuple(clip(launcher_output)),
            time=end,
        )
        records[0] = record(first, RankStatus.FAILED, failure=failure)
    return records


def launch_times(
    workdir: Path, rank: int, go: float | None, spawned: float, forked: bool
) -> dict[str, Any]:
    """When a rank's launch reached each step (wall clock on its host), for the run's record.

    Args:
        workdir: where the rank wrote its own timestamps (absent if it did not return).
        rank: the rank.
        go: when its task heard that every task had arrived (None: it did not wait for it).
        spawned: when its process was asked for.
        forked: whether it was forked from a warm zygote.
    """
    times: dict[str, Any] = {"go": go, "spawned": spawned, "forked": forked}
    path = workdir / contract.times_file_name(rank)
    try:
        times.update(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    return times
