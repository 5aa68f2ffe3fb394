"""The run's message kinds (sparktrain.wire.protocol): building and checking messages."""

from __future__ import annotations

from typing import Any

import pytest

from sparktrain.wire import protocol


def test_every_kind_has_a_distinct_name() -> None:
    kinds = {
        k
        for group in (
            protocol.TO_DRIVER,
            protocol.TO_TASK,
            protocol.TO_PEER,
            protocol.TO_AGENT,
            protocol.TO_MEMBER,
        )
        for k in group
    }
    assert len({k.name for k in kinds}) == len(kinds) == 29
    assert protocol.AUTH not in {k.name for k in kinds}  # consumed by the server


def test_built_messages_parse_as_their_kind() -> None:
    built = [
        (protocol.HELLO(index=0, info={"host": "h"}), protocol.TO_DRIVER),
        (protocol.STARTED(rank=1, pid=2, host="h", index=1), protocol.TO_DRIVER),
        (protocol.LOG(rank=0, line="x"), protocol.TO_DRIVER),
        (protocol.LOGS(rank=0, lines=["x"], dropped=2, where=""), protocol.TO_DRIVER),
        (protocol.USER_LOG(rank=0, message="x"), protocol.TO_DRIVER),
        (protocol.REPORT(rank=0, step=None, epoch=3, metrics={"loss": 0.1}), protocol.TO_DRIVER),
        (protocol.FAILURE(failure={"rank": 0}), protocol.TO_DRIVER),
        (protocol.EXITED(index=0), protocol.TO_DRIVER),
        (protocol.STACK(record={"rank": 0}, stopped=True), protocol.TO_DRIVER),
        (protocol.ACTIVE(rank=1), protocol.TO_DRIVER),
        (protocol.RESULT_CHUNK(index=0, offset=0, blob=b"x"), protocol.TO_DRIVER),
        (protocol.RESULT_END(index=0, size=1, sha256="ab"), protocol.TO_DRIVER),
        (protocol.RESULT_SAVED(ok=False, error="full"), protocol.TO_TASK),
        (protocol.SHOW_STACKS(reason="quiet"), protocol.TO_TASK),
        (protocol.SHARED(values={"HOROVOD_GLOO_RENDEZVOUS_PORT": "1"}), protocol.TO_DRIVER),
        (protocol.ABORT(reason="r"), protocol.TO_TASK),
        (
            protocol.GO(
                world_size=1,
                num_nodes=1,
                master_addr="h",
                master_port=1,
                first={"rank": 0},
                ranks=[{"rank": 0}],
                host_nodes=[["h", [1]]],
                num_hosts=1,
                nodes="host",
                probing=False,
                probe=[],
            ),
            protocol.TO_TASK,
        ),
        (protocol.LAYOUT(ranks=[{"rank": 0}]), protocol.TO_TASK),
        (protocol.SHARED(values={}), protocol.TO_TASK),
        (protocol.RSH(host="h", command="orted"), protocol.TO_PEER),
        (protocol.MEMBER(index=2), protocol.TO_PEER),
        (protocol.DAEMON_STARTED(host="h"), protocol.TO_PEER),
        (protocol.HOST_DONE(host="h", code=0, errors={}, tail=[]), protocol.TO_PEER),
        (protocol.RSH_OUTPUT(line="x"), protocol.TO_AGENT),
        (protocol.RSH_EXIT(code=255), protocol.TO_AGENT),
        (protocol.RELEASE(), protocol.TO_MEMBER),
    ]
    for message, accepted in built:
        kind = protocol.parse(message, accepted)
        assert kind is not None and kind.name == message["type"]


@pytest.mark.parametrize(
    "message, why",
    [
        ({"type": "started"}, "no fields at all"),
        ({"type": "started", "rank": 0, "pid": 1, "host": "h"}, "missing index"),
        ({"type": "log", "rank": "0", "line": "x"}, "rank as a string"),
        ({"type": "log", "rank": True, "line": "x"}, "a bool is no rank"),
        ({"type": "log", "rank": 0, "line": None}, "line missing its text"),
        ({"type": "hello", "index": 0, "info": []}, "info not an object"),
        ({"type": "report", "rank": 0, "step": 1.5, "epoch": None, "metrics": {}}, "float step"),
        ({"type": "nonsense"}, "unknown kind"),
        ({"type": ["log"], "rank": 0, "line": "x"}, "unhashable type"),
        ({"rank": 0, "line": "x"}, "no type"),
        ({"type": "abort", "reason": "x"}, "a driver message sent to the driver"),
        ({"type": "auth"}, "the server's own frame"),
    ],
)
def test_malformed_or_misdirected_messages_do_not_parse(message: dict[str, Any], why: str) -> None:
    assert protocol.parse(message, protocol.TO_DRIVER) is None, why


def test_building_a_malformed_message_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="without 'line'"):
        protocol.LOG(rank=0)
    with pytest.raises(ValueError, match="code of type str"):
        protocol.RSH_EXIT(code="1")
