"""sparktrain's built-in horovod.torch: process sets, SyncBatchNorm and the timeline, on 2 and
3 ranks on the driver (np<0, no Spark job), with Horovod's semantics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
from tests.fixtures import hvd_sets


def _views(n: int, fn: Any, **kwargs: Any) -> list[dict[str, Any]]:
    runner = SparkRunner(np=-n, backend="horovod", horovod_impl="builtin")
    views: list[dict[str, Any]] = runner.run(fn, **kwargs)["views"]
    assert len(views) == n
    return views


@pytest.mark.parametrize("n", [2, 3])
def test_process_sets_as_horovod(n: int) -> None:
    views = _views(n, hvd_sets.process_sets)
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    for rank, view in enumerate(views):
        members = evens if rank % 2 == 0 else odds
        place = members.index(rank)
        k = len(members)
        assert view["global"] == [0, list(range(n))]
        assert view["ids"] == [1, 2]  # the same ids on every rank, in the order registered
        assert view["mine"] == [members, k, place, True, False]
        # Counted within the set: the average divides by its size, the gather is in its order.
        assert view["average"] == [sum(m + 1 for m in members) / k]
        assert view["int_sum"] == [sum(m + 1 for m in members)]
        assert view["allgather"] == [m for m in members for _ in range(m + 1)]
        assert view["broadcast"] == [members[-1]]  # the root is a global rank
        assert view["alltoall"] == [10 * m + place for m in members]
        total = sum(m for m in members)
        assert view["reducescatter"] == [[2 * place * k + total, (2 * place + 1) * k + total]]
        assert view["grouped"] == [[members[-1] + 1.0], [2.0 * (members[-1] + 1)]]
        assert view["object"] == {"from": members[-1]}
        assert view["objects"] == [10 * m for m in members]
        assert view["allgather_grad"] == [1.0, 1.0]  # the set's average of ones
        # The evens average their gradients (r + 1); a rank outside steps on its own.
        expected = sum(m + 1 for m in evens) / len(evens) if rank in evens else rank + 1
        assert view["optimizer"] == [-expected]
        errors = view["errors"]
        for key, (kind, base, _) in errors.items():
            assert (kind, base) == ("ValueError", "ValueError"), key
        others = odds if rank % 2 == 0 else evens
        assert errors["not_member"][2] == (
            f"hvd.allreduce: rank {rank} is not a member of the provided process set {others}; "
            "call it only on the set's ranks (process_set.included())"
        )
        assert errors["root_outside"][2] == (
            f"root_rank={others[0]} is not in the process set {members}: a root is given as its "
            "global rank (hvd.rank() on the root), and must be a member"
        )
        assert errors["duplicate"][2] == (
            "Attempted to add a duplicate process set: "
            f"ProcessSet(process_set_id=None, ranks={members}, mpi_comm=None)"
        )
        assert "Attempted to add a duplicate process set" in errors["duplicate_global"][2]
        assert errors["not_a_rank"][2] == (
            f"a process set's ranks must be distinct ranks of this job (0..{n - 1}), not [0, {n}]"
        )
        assert errors["not_ranks"][2] == "ProcessSet takes a list of integer ranks, not ['0']"
        # The global set is never removed; a set is removed once, and forgets its id.
        assert view["remove"] == [False, True, False, None, None]
        assert view["removed"][2] == (
            f"ProcessSet(process_set_id=None, ranks={odds}, mpi_comm=None) is not registered: "
            "pass it to hvd.init(process_sets=[...]) or hvd.add_process_set() on every rank first"
        )
        assert view["after"] == [n * (n + 1) / 2]  # the job goes on after every refusal
        assert view["after_shutdown"] == [None, None]
        assert view["init_duplicate"][2] == (
            "Horovod could not be initialized because process_sets entry number 1 is a "
            "duplicate or invalid: Attempted to add a duplicate process set: "
            "ProcessSet(process_set_id=None, ranks=[0], mpi_comm=None)"
        )


def test_sync_batch_norm_matches_one_batch_norm_over_the_whole_batch() -> None:
    # Three ranks holding 1, 2 and 3 rows: the statistics weigh each rank by its rows.
    for view in _views(3, hvd_sets.sync_batch_norm):
        # Output, input gradient, running statistics, the parameters' gradients summed over
        # the ranks, and eval mode: those of one BatchNorm2d over every rank's rows (float64).
        assert view["diffs"] == pytest.approx(dict.fromkeys(view["diffs"], 0.0), abs=1e-12)
        assert view["batches"] == 2
        assert view["moved"] > 0.01  # the running variance did move away from its start
        assert view["one_d"] == [
            "ValueError",
            "ValueError",
            "expected at least 2D input (got 1D input)",
        ]


def test_timeline_is_written_by_rank_0_as_a_chrome_trace(tmp_path: Path) -> None:
    views = _views(2, hvd_sets.timeline, path=str(tmp_path / "timeline.json"))
    for view in views:
        assert view["before"][2] == "Horovod has not been initialized; use hvd.init()."
        # A step after synchronize() outside skip_synchronize() warns in Horovod's words;
        # inside it, nothing.
        assert view["said"] == [
            "optimizer.step() called without optimizer.skip_synchronize() context after "
            "optimizer.synchronize(): the gradients are reduced again; step inside "
            "`with optimizer.skip_synchronize():` after synchronizing"
        ]
    assert views[1]["written"] == {}  # rank 1 writes nothing
    first, second = views[0]["written"]["1"], views[0]["written"]["2"]
    header = first[0]
    assert header["args"]["start_time_since_epoch_in_micros"] > 0
    rows = {e["args"]["name"]: e["pid"] for e in first if e["ph"] == "M" and e["pid"]}
    assert list(rows) == ["allreduce.test_allreduce", "allgather.noname"]
    for label, op in (("allreduce.test_allreduce", "ALLREDUCE"), ("allgather.noname", "ALLGATHER")):
        events = [(e["name"], e["ph"]) for e in first if e["pid"] == rows[label] and "ts" in e]
        assert events == [(f"NEGOTIATE_{op}", "B"), (f"NEGOTIATE_{op}", "E"), (op, "i")]
    assert [e["name"] for e in first if e["pid"] == 0 and "ts" in e] == ["CYCLE_START"] * 2
    times = [e["ts"] for e in first if "ts" in e]
    assert times == sorted(times)
    # The second: only what ran while it recorded, no cycle marks.
    assert [e.get("args", {}).get("name", e["name"]) for e in second[1:]] == [
        "broadcast.weights",
        "NEGOTIATE_BROADCAST",
        "NEGOTIATE_BROADCAST",
        "BROADCAST",
    ]
