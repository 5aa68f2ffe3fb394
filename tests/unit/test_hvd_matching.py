"""The built-in horovod.torch's matching of the ranks' operations (which runs next, decided the
same on every rank from the rows of a round), its names in flight, and ``init(comm=...)``.

The rounds themselves run between real ranks in tests/spark/test_hvd_compat.py; here the
decision is checked on rows made as the ranks make them, and the single-rank parts in this
process.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from sparktrain.hvdcompat import api, basics
from sparktrain.hvdcompat.matching import decide
from sparktrain.hvdcompat.negotiate import SLOTS, Request, encode

NONE, PENDING, CURRENT, WAIT = 0, 1, 2, 3
FLOATS = Request("allreduce", "grad", torch.zeros(4))
DOUBLES = Request("allreduce", "grad", torch.zeros(4, dtype=torch.float64))
BARRIER = Request("barrier")


def _row(
    next_: Request, next_flag: int, in_: Request | None = None, in_flag: int = NONE
) -> list[int]:
    """A rank's offer, as matching._round lays it out."""
    return [*encode(next_), *(encode(in_) if in_ else [0] * SLOTS), next_flag, in_flag]


def test_operations_every_rank_started_run_in_the_round() -> None:
    rows = [_row(FLOATS, PENDING), _row(FLOATS, PENDING)]
    assert decide(rows, FLOATS, None, 0).action == "run_next"


def test_an_operation_started_alone_stays_pending_while_the_other_is_in_barrier() -> None:
    # Rank 0 starts 'grad'; rank 1 is in barrier(): nothing runs, nothing fails.
    rows = [_row(FLOATS, PENDING), _row(BARRIER, CURRENT, BARRIER, CURRENT)]
    assert decide(rows, FLOATS, None, 0).action == "none"
    assert decide(rows, BARRIER, BARRIER, 1).action == "none"
    # Then rank 0 enters barrier() too, its 'grad' still pending: the barrier passes.
    rows = [_row(FLOATS, PENDING, BARRIER, CURRENT), _row(BARRIER, CURRENT, BARRIER, CURRENT)]
    assert decide(rows, FLOATS, BARRIER, 0).action == "run_in"
    # Rank 1 starts 'grad' while rank 0 is in its next barrier(): 'grad' runs on both.
    rows = [_row(FLOATS, PENDING, BARRIER, CURRENT), _row(FLOATS, PENDING)]
    assert decide(rows, FLOATS, BARRIER, 0).action == "run_next"


def test_blocked_ranks_whose_calls_do_not_fit_fail_on_every_rank() -> None:
    # Rank 0 waits for 'grad', which rank 1 (in barrier) has not started: a deadlock in
    # Horovod; here both calls fail, each rank naming both.
    rows = [_row(FLOATS, PENDING, FLOATS, WAIT), _row(BARRIER, CURRENT, BARRIER, CURRENT)]
    for me, (mine, inside) in enumerate([(FLOATS, FLOATS), (BARRIER, BARRIER)]):
        decision = decide(rows, mine, inside, me)
        assert decision.action == "fail_in"
        assert (
            "the ranks called different collectives at the same point: rank 0 hvd.allreduce, "
            "rank 1 hvd.barrier"
        ) in str(decision.error)


def test_started_operations_that_do_not_fit_fail_naming_the_difference() -> None:
    rows = [_row(FLOATS, PENDING), _row(DOUBLES, PENDING)]
    decision = decide(rows, FLOATS, None, 0)
    assert decision.action == "fail_next"
    assert "tensors of different data types: rank 0 float32, rank 1 float64" in str(decision.error)


def test_joined_ranks_stand_in_for_allreduce_only() -> None:
    join = Request("join", root=3)
    rows = [_row(FLOATS, PENDING), _row(join, CURRENT, join, CURRENT)]
    decision = decide(rows, join, join, 1)
    assert (decision.action, decision.joined) == ("run_next", (1,))
    rows = [_row(BARRIER, CURRENT, BARRIER, CURRENT), _row(join, CURRENT, join, CURRENT)]
    decision = decide(rows, BARRIER, BARRIER, 0)
    assert decision.action == "fail_next"
    assert "hvd.barrier cannot run while rank(s) 1 have joined (hvd.join)" in str(decision.error)
    rows = [_row(join, CURRENT, join, CURRENT)] * 2
    assert decide(rows, join, join, 0).action == "all_joined"


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as rank 0 of a job of one, meeting on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "HOROVOD_RANK": "0",
        "HOROVOD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(basics, "_rendezvous", basics._Rendezvous())
    yield
    api.shutdown()


def test_a_name_is_held_until_synchronize(one_rank: None) -> None:
    api.init()
    first = api.allreduce_async(torch.tensor([2.0]), name="loss", op=api.Sum)
    with pytest.raises(ValueError, match=r"an operation named 'loss' is still in flight") as err:
        api.allreduce_async(torch.tensor([1.0]), name="loss")
    assert "hvd.synchronize() the first" in str(err.value)
    assert api.synchronize(first).tolist() == [2.0]
    assert api.allreduce(torch.tensor([5.0]), name="loss", op=api.Sum).tolist() == [5.0]


def test_init_comm_listing_every_rank_in_order_is_the_whole_job(one_rank: None) -> None:
    api.init(comm=[0])
    assert (api.rank(), api.size(), dist.get_world_size()) == (0, 1, 1)
    api.shutdown()
    api.init(comm=[])  # Horovod reads an empty list as every rank
    assert api.size() == 1
    api.init(comm=[0])  # a second init() checks comm, then does nothing
    assert api.size() == 1


def test_init_comm_that_is_not_the_whole_job_is_refused_before_joining(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    with pytest.raises(ValueError, match=r"comm=\[0, 2\]\).*hvd\.ProcessSet\(\[0, 2\]\).* np=2"):
        api.init(comm=[0, 2])
    with pytest.raises(ValueError, match="list all of them in order"):
        api.init(comm=[1, 0, 2, 3])
    with pytest.raises(ValueError, match="list of integer ranks"):
        api.init(comm=[0, "1"])
    with pytest.raises(NotImplementedError, match=r"MPI communicator.*hvd.ProcessSet"):
        api.init(comm=object())
    assert not dist.is_initialized() and not api.is_initialized()
