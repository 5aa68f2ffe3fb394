"""Every message of a run: its kind, who sends it to whom, and the fields it must carry.

A message is a JSON object with ``"type"`` naming its :class:`Kind`. Senders build messages
with the kind (``protocol.LOG(rank=0, line="...")``), receivers check them with
:func:`parse` against the kinds they accept: a message that authenticated but is of another
kind, or lacks a field, or carries one of the wrong type, is dropped and counted by the
receiver, never acted upon.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from sparktrain.wire.frames import AUTH as AUTH

_NONE = type(None)


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of message.

    Attributes:
        name: the value of its ``"type"`` field.
        fields: each required field and the JSON types it may have.
    """

    name: str
    fields: Mapping[str, tuple[type, ...]] = dataclasses.field(default_factory=dict)

    def __call__(self, **fields: Any) -> dict[str, Any]:
        """A message of this kind.

        Raises:
            ValueError: a required field is missing, or one is of the wrong type.
        """
        message = {"type": self.name, **fields}
        problem = self.problem(message)
        if problem is not None:
            raise ValueError(problem)
        return message

    def problem(self, message: Mapping[str, Any]) -> str | None:
        """What is wrong with ``message`` as one of this kind, or None."""
        for name, types in self.fields.items():
            if name not in message:
                return f"{self.name} message without {name!r}"
            value = message[name]
            if isinstance(value, bool) and bool not in types:
                return f"{self.name} message with {name}={value!r}"
            if not isinstance(value, types):
                return f"{self.name} message with {name} of type {type(value).__name__}"
        return None

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kind) and other.name == self.name


def _kind(name: str, **fields: type | tuple[type, ...]) -> Kind:
    return Kind(name, {k: v if isinstance(v, tuple) else (v,) for k, v in fields.items()})


# -- tasks and workers → the driver's channel ----------------------------------------------
HELLO = _kind("hello", index=int, info=dict)  # a task reached the rendezvous
STARTED = _kind("started", rank=int, pid=int, host=str, index=int)  # a rank's process runs
LOG = _kind("log", rank=int, line=str)  # a line of a rank's output
# A batch of a rank's output lines, and how many lines were not forwarded since its previous
# batch (over the rank's budget, see sparktrain.task.logs) with the file that keeps them all
# ("" when none does).
LOGS = _kind("logs", rank=int, lines=list, dropped=int, where=str)
USER_LOG = _kind("user_log", rank=int, message=str)  # sparktrain.log_to_driver()
REPORT = _kind(  # sparktrain.report()
    "report", rank=int, step=(int, _NONE), epoch=(int, _NONE), metrics=dict
)
# Rank 0 committed checkpoint ``step`` (sparktrain.checkpoint.save): an elastic run below
# its max may stop there to grow.
SAVED = _kind("saved", rank=int, step=int)
FAILURE = _kind("failure", failure=dict)  # a rank failed (a WorkerFailure as JSON)
EXITED = _kind("exited", index=int)  # a task's ranks are all gone
# Where a rank's main thread is: a WorkerFailure as JSON with its where, stack and output tail;
# stopped=False: asked for with SHOW_STACKS, the rank runs on; True: dumped as it was stopped.
STACK = _kind("stack", record=dict, stopped=bool)
# A rank printed lines that its task does not forward (driver_log_verbosity), so the run is
# not stalled; a task sends it at most every few seconds.
ACTIVE = _kind("active", rank=int)
# The collectives each of a task's ranks entered and completed so far, as [rank, entered,
# completed] rows, when any moved (for the driver's hang watch; every few seconds at most).
COLLECTIVES = _kind("collectives", counts=list)
# Rank 0's pickled result, in pieces that fit a frame (raw, as the frame's blob), then its size
# and SHA-256: it travels over the channel, never through Spark's task results (which an
# executor's heap must hold whole, and several times over).
RESULT_CHUNK = _kind("result_chunk", index=int, offset=int, blob=(bytes, memoryview))
RESULT_END = _kind("result_end", index=int, size=int, sha256=str)
# What a host's prober reached (interface name -> indices of the probed tasks that answered),
# when the ranks span hosts; the driver answers every task with CHOSEN once every host's
# prober has said (see sparktrain.layout.rendezvous).
PROBED = _kind("probed", index=int, reached=dict)
# -- the driver → tasks ----------------------------------------------------------------------
ABORT = _kind("abort", reason=str)  # stop every rank now
# Every task has arrived: start. What this connection's tasks need of the layout (fields:
# sparktrain.layout.rendezvous); LAYOUT messages before it carry the rank entries that do not fit it.
GO = _kind(
    "go",
    world_size=int,
    num_nodes=int,
    num_hosts=int,
    nodes=str,
    master_addr=str,
    master_port=int,
    first=dict,
    ranks=list,
    host_nodes=list,
    probing=bool,
    probe=list,
)
LAYOUT = _kind("layout", ranks=list)
SHOW_STACKS = _kind("show_stacks", reason=str)  # send every running rank's STACK
CHOSEN = _kind("chosen", ifname=str)  # the network interface every rank talks over
# The driver's answer to RESULT_END: it holds the result (ok), or why not.
RESULT_SAVED = _kind("result_saved", ok=bool, error=str)
# both ways: rank 0's task → the driver → every task; what the backend prepared for the ranks
SHARED = _kind("shared", values=dict)
# -- an MPI run: mpirun's agent and the other tasks → a task's peer server ----------------
RSH = _kind("rsh", host=str, command=str)  # start the daemon for this host
MEMBER = _kind("member", index=int)  # a task joins the launcher
DAEMON_STARTED = _kind("daemon_started", host=str)
HOST_DONE = _kind("host_done", host=str, code=int, errors=dict, tail=list)
# -- a task's peer server → mpirun's agent, and the launcher → its members ---------------
RSH_OUTPUT = _kind("rsh_output", line=str)
RSH_EXIT = _kind("rsh_exit", code=int)
RELEASE = _kind("release")

TO_DRIVER: frozenset[Kind] = frozenset(
    {
        HELLO,
        STARTED,
        LOG,
        LOGS,
        USER_LOG,
        REPORT,
        SAVED,
        FAILURE,
        EXITED,
        STACK,
        ACTIVE,
        COLLECTIVES,
        SHARED,
        RESULT_CHUNK,
        RESULT_END,
        PROBED,
    }
)
TO_TASK: frozenset[Kind] = frozenset({ABORT, GO, LAYOUT, SHOW_STACKS, SHARED, RESULT_SAVED, CHOSEN})
TO_PEER: frozenset[Kind] = frozenset({RSH, MEMBER, DAEMON_STARTED, HOST_DONE})
TO_AGENT: frozenset[Kind] = frozenset({RSH_OUTPUT, RSH_EXIT})
TO_MEMBER: frozenset[Kind] = frozenset({RELEASE})

_BY_NAME = {
    kind.name: kind
    for kinds in (TO_DRIVER, TO_TASK, TO_PEER, TO_AGENT, TO_MEMBER)
    for kind in kinds
}


def parse(message: Mapping[str, Any], accepted: Collection[Kind]) -> Kind | None:
    """The kind of ``message`` if it is one of ``accepted`` and well formed, else None."""
    name = message.get("type")
    kind = _BY_NAME.get(name) if isinstance(name, str) else None
    if kind is None or kind not in accepted or kind.problem(message) is not None:
        return None
    return kind


__all__ = [
    "ABORT",
    "ACTIVE",
    "AUTH",
    "CHOSEN",
    "COLLECTIVES",
    "DAEMON_STARTED",
    "EXITED",
    "FAILURE",
    "GO",
    "HELLO",
    "HOST_DONE",
    "LAYOUT",
    "LOG",
    "LOGS",
    "MEMBER",
    "PROBED",
    "RELEASE",
    "REPORT",
    "RSH",
    "RSH_EXIT",
    "RSH_OUTPUT",
    "SAVED",
    "SHARED",
    "SHOW_STACKS",
    "STACK",
    "STARTED",
    "TO_AGENT",
    "TO_DRIVER",
    "TO_MEMBER",
    "TO_PEER",
    "TO_TASK",
    "USER_LOG",
    "Kind",
    "parse",
]
