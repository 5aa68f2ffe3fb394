"""The error tree of sparktrain, and the record of one failed rank."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping, Sequence
from typing import Any


class SparkTrainError(Exception):
    """Base class of every error sparktrain raises."""


class ConfigurationError(SparkTrainError, ValueError):
    """A setting is invalid or a needed component is missing; the message names the fix."""


class CapacityError(SparkTrainError):
    """The cluster cannot run the requested number of ranks at once."""


class PayloadError(SparkTrainError):
    """The function, its arguments or its result cannot be pickled or are too large."""


class CallError(PayloadError, TypeError):
    """The arguments given to ``run()`` do not fit the function's signature (found on the
    driver, before anything is submitted)."""


class RendezvousTimeoutError(SparkTrainError, TimeoutError):
    """Some ranks never reached the rendezvous within ``start_timeout``.

    Attributes:
        missing: the ranks (task indices) that never arrived.
    """

    def __init__(self, message: str, missing: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.missing))


class RunTimeoutError(SparkTrainError, TimeoutError):
    """The run took longer than its ``timeout``; every rank was stopped.

    Attributes:
        reason: what happened, without the ranks' stacks.
        stopped: the ranks that were still running, by rank: where each was, its stack and
            its last output lines (see :func:`describe_stopped`).
    """

    def __init__(self, reason: str, stopped: Mapping[int, WorkerFailure] | None = None) -> None:
        self.reason = reason
        self.stopped = dict(stopped or {})
        report = describe_stopped(self.stopped)
        super().__init__(f"{reason}\n\n{report}" if report else reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.stopped))


class RunStalledError(RunTimeoutError):
    """No rank printed or reported anything for ``stall_timeout`` (with
    ``stall_action="fail"``); every rank was stopped, and their stacks are in the message."""


class RunHungError(RunStalledError):
    """Ranks waited in a collective for ``stall_timeout`` for ranks that never joined it
    (see ``stall_timeout``); every rank was stopped. The message names the ranks behind, with
    their host and pid, and every rank's stack."""


# What a collective raises when a peer is gone (Horovod, Gloo, NCCL, sockets).
PEER_LOSS_SIGNS = (
    "Horovod has been shut down",
    "HorovodInternalError",
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "DistBackendError",
    "NCCL communicator was aborted",
)


# What torch says when a rank asks for NCCL where it cannot have it (a CPU build of torch, a
# machine or a task without a GPU), and what to do instead.
NCCL_WITHOUT_GPU_SIGNS = (
    "Distributed package doesn't have NCCL built in",
    "ProcessGroupNCCL is only supported with GPUs",
)
NCCL_WITHOUT_GPU_HINT = (
    "hint: the NCCL backend needs a CUDA GPU for each rank and a torch built with CUDA, and "
    "this rank has none. Call dist.init_process_group(sparktrain.default_backend()), which is "
    '"nccl" where a rank has a GPU and "gloo" where it has none, or use "gloo" on CPUs.'
)


def hint_for(text: str) -> str:
    """The advice for a rank's error whose type, message or traceback is ``text`` ('' for
    none)."""
    if any(sign in text for sign in NCCL_WITHOUT_GPU_SIGNS) or (
        "NCCL" in text and "no CUDA-capable device is detected" in text
    ):
        return NCCL_WITHOUT_GPU_HINT
    return ""


@dataclasses.dataclass(frozen=True)
class WorkerFailure:
    """What is known about one rank that failed.

    Attributes:
        rank: global rank (the task index before rendezvous).
        host: host the rank ran on.
        exc_type: the exception class name, when the worker raised.
        message: the exception message, or a description of how the process ended.
        traceback: the worker's Python traceback, when there is one.
        exit_code: the process exit code (negative: killed by that signal).
        output_tail: the last lines the rank printed.
        time: wall-clock time the failure was seen, for ordering root causes.
        user_error: True when the user's function raised (as opposed to a crash or kill).
        phase: where it failed: "load" (unpickling the function), "run" (the function),
            "result" (pickling rank 0's result), "lost" (the process or task vanished);
            or "stopped": it had not failed but was still running when the run was stopped;
            or "running": where a rank that runs on was when asked (a stall).
        where: for a stopped rank, where its main thread was: the innermost call and the
            user's line that made it (see :func:`sparktrain.stacks.where`).
        stack: for a stopped rank, its main thread's stack, most recent call last.
    """

    rank: int
    host: str = ""
    exc_type: str | None = None
    message: str = ""
    traceback: str | None = None
    exit_code: int | None = None
    output_tail: tuple[str, ...] = ()
    time: float = 0.0
    user_error: bool = False
    phase: str = "run"
    where: str = ""
    stack: str | None = None

    @property
    def follows_peer_loss(self) -> bool:
        """Whether this reads as a consequence of another rank going away (a collective that
        lost its peer), which makes it a poor root cause even when it was seen first."""
        if self.exc_type is None:
            return False
        text = f"{self.exc_type}: {self.message}"
        return any(sign in text for sign in PEER_LOSS_SIGNS)

    @property
    def how(self) -> str:
        """A short phrase for how the rank ended: exception, exit code or signal name."""
        if self.phase == "stopped":
            return "was still running"
        if self.phase == "running":
            return "is running"
        if self.exc_type:
            return f"raised {self.exc_type}"
        if self.exit_code is None:
            return "was lost"
        if self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            return f"was killed by {name}"
        return f"exited with code {self.exit_code}"

    @property
    def hint(self) -> str:
        """Advice for an error that has a known fix ('' for none; see :func:`hint_for`)."""
        if self.exc_type is None and not self.traceback:
            return ""
        return hint_for(f"{self.exc_type}: {self.message}\n{self.traceback or ''}")

    def describe(self, tail_lines: int = 20) -> str:
        """Render this failure for a human: headline, hint, traceback, last output lines."""
        where = f" on {self.host}" if self.host else ""
        if self.rank < 0:
            # Not a rank's end but the launch's own (a Spark job that failed by itself).
            head = self.message or "the Spark job failed"
        else:
            head = f"rank {self.rank}{where} {self.how}"
            if self.message or self.where:
                head += f": {self.message or self.where}"
        parts = [head]
        if self.hint:
            parts.append(self.hint)
        if self.traceback:
            parts.append(self.traceback.rstrip())
        if self.stack:
            parts.append("its main thread's stack (most recent call last):")
            parts.append(self.stack.rstrip())
        tail = _without_traceback(list(self.output_tail), self.traceback)[-tail_lines:]
        if tail:
            parts.append(f"last {len(tail)} line(s) of rank {self.rank}'s output:")
            parts.extend(f"  | {line}" for line in tail)
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict of this record."""
        data = dataclasses.asdict(self)
        data["output_tail"] = list(self.output_tail)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerFailure:
        """Rebuild a record from :meth:`to_json` output, ignoring unknown keys.

        Raises:
            ValueError: ``rank`` is missing, or a field has a value of the wrong type.
        """
        kwargs = {k: v for k, v in data.items() if k in _FIELD_TYPES}
        for name, value in kwargs.items():
            types = _FIELD_TYPES[name]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise ValueError(f"failure record field {name}={value!r:.80}")
        if "rank" not in kwargs:
            raise ValueError("failure record without a rank")
        tail = kwargs.get("output_tail") or ()
        kwargs["output_tail"] = tuple(str(line) for line in tail)
        return cls(**kwargs)


_NONE = type(None)
# The JSON types each field of a WorkerFailure record may take.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "rank": (int,),
    "host": (str,),
    "exc_type": (str, _NONE),
    "message": (str,),
    "traceback": (str, _NONE),
    "exit_code": (int, _NONE),
    "output_tail": (list, tuple, _NONE),
    "time": (int, float),
    "user_error": (bool,),
    "phase": (str,),
    "where": (str,),
    "stack": (str, _NONE),
}


def _without_traceback(tail: list[str], traceback: str | None) -> list[str]:
    """The output lines minus the traceback the worker also printed (it is shown once)."""
    if not traceback:
        return tail
    tb_lines = set(traceback.rstrip().splitlines())
    start = next(
        (
            i
            for i in range(len(tail) - 1, -1, -1)
            if tail[i].startswith("Traceback (most recent call last)")
        ),
        None,
    )
    if start is None:
        # The tail may hold only the end of a long traceback.
        start = len(tail)
        while start > 0 and tail[start - 1] in tb_lines:
            start -= 1
    end = start
    while end < len(tail) and tail[end] in tb_lines:
        end += 1
    return tail[:start] + tail[end:]


def _last_line(text: str) -> str:
    """The last line of ``text`` that is not blank (a traceback's exception line)."""
    return next((line for line in reversed(text.splitlines()) if line.strip()), "")


def describe_stopped(stopped: Mapping[int, WorkerFailure], tail_lines: int = 10) -> str:
    """Where each rank was when the run was stopped: one line per rank, then each rank's
    stack and last output lines; empty for no ranks."""
    if not stopped:
        return ""
    ranks = [stopped[rank] for rank in sorted(stopped)]
    lines = ["Where each rank was when it was stopped:"]
    lines.extend(
        f"  rank {r.rank}: {r.where or r.message or 'its stack could not be read'}" for r in ranks
    )
    for rank in ranks:
        lines.append("")
        lines.append(rank.describe(tail_lines=tail_lines))
    return "\n".join(lines)


def root_cause_order(failure: WorkerFailure) -> tuple[bool, float, int]:
    """The sort key of the order a :class:`WorkerFailedError` shows failures in, root cause
    first: earliest first, but a rank that only lost its peer never hides the one that left."""
    return (failure.follows_peer_loss, failure.time, failure.rank)


class WorkerFailedError(SparkTrainError):
    """One or more ranks failed; the root cause comes first.

    The root cause is the earliest failure, except that failures which read as a consequence
    of losing a peer (a collective raising "connection closed by peer", "Horovod has been
    shut down", …) rank after every other kind, whatever their time. The ranks that had not
    failed but were stopped because of it follow the other failed ranks, with where each
    was; when anything follows the root cause, the message ends with it again (its headline
    and its exception's line), so that the last lines shown name it.

    Attributes:
        failures: every failed rank's record, by rank.
        root_cause: the failure shown first.
        stopped: the ranks that were still running when the run was stopped, by rank.
    """

    def __init__(
        self,
        failures: Mapping[int, WorkerFailure],
        context: str = "",
        stopped: Mapping[int, WorkerFailure] | None = None,
    ) -> None:
        if not failures:
            raise ValueError("WorkerFailedError needs at least one failure")
        self.failures = dict(failures)
        self.context = context
        self.stopped = {r: f for r, f in (stopped or {}).items() if r not in self.failures}
        ordered = sorted(self.failures.values(), key=root_cause_order)
        self.root_cause = ordered[0]
        others = ordered[1:]
        lines = [f"{len(ordered)} rank(s) failed{context}. Root cause:", ""]
        lines.append(self.root_cause.describe())
        if others:
            lines.append("")
            lines.append("Other failed ranks:")
            for failure in others:
                lines.append("")
                lines.append(failure.describe(tail_lines=5))
        if self.stopped:
            lines.append("")
            lines.append(describe_stopped(self.stopped, tail_lines=5))
        if others or self.stopped:
            # What a terminal shows last is what is read first: the root cause again, not
            # the last of the ranks that followed it.
            lines.append("")
            head = self.root_cause.describe().splitlines()[0]
            lines.append(f"Root cause, as above: {head}")
            if self.root_cause.traceback:
                lines.append(_last_line(self.root_cause.traceback))
            if self.root_cause.hint:
                lines.append(self.root_cause.hint)
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.context, self.stopped))
