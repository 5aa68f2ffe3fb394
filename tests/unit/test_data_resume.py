"""Resharding an interrupted epoch: pure index math, no I/O (sparktrain.data.resharding)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from sparktrain.data import resume_state
from sparktrain.data.resharding import (
    StagePlan,
    plan_stage,
    spans_from_positions,
    spans_of,
    subtract,
    union,
    windows,
)
from sparktrain.data.sharding import plan_shard
from sparktrain.errors import ConfigurationError


def served_order(plan: StagePlan, rows: int) -> list[int]:
    """The positions a shard serves first, in order, window by window as the loader mixes."""
    out: list[int] = []
    for number, group in enumerate(windows(plan.segments, plan.window)):
        out.extend(int(p) for p in plan.window_positions(number, group))
    return out[:rows]


def run_stage(
    piece_rows: list[int], stages: list, count: int, stop: list[int] | None, **order: object
) -> tuple[list[StagePlan], list[list[int]]]:
    """Every shard of the stage after ``stages``: plans and positions served (to ``stop``)."""
    plans = [
        plan_stage(piece_rows, stages=stages, shard_count=count, shard=shard, **order)  # type: ignore[arg-type]
        for shard in range(count)
    ]
    served = [
        served_order(plan, plan.rows if stop is None else stop[shard])
        for shard, plan in enumerate(plans)
    ]
    return plans, served


def test_span_algebra() -> None:
    spans = spans_from_positions(np.array([5, 1, 2, 3, 9, 8]))
    assert spans[0].tolist() == [1, 5, 8] and spans[1].tolist() == [4, 6, 10]
    merged = union([spans_of([0, 3], [2, 6]), spans_of([1, 8], [4, 9])])
    assert merged[0].tolist() == [0, 8] and merged[1].tolist() == [6, 9]
    left = subtract(spans_of([0, 10], [8, 20]), spans_of([2, 7, 15], [4, 12, 16]))
    assert left[0].tolist() == [0, 4, 12, 16] and left[1].tolist() == [2, 7, 15, 20]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_first_stage_is_the_ordinary_epoch(shuffle: bool, drop_last: bool) -> None:
    pieces = [40, 7, 13, 1, 22]
    for count in (1, 3, 8):
        for shard in range(count):
            common = dict(batch_size=3, drop_last=drop_last, epoch=2, seed=5, shuffle=shuffle)
            staged = plan_stage(
                pieces, stages=[], shard_count=count, shard=shard, window=2, **common
            )
            plain = plan_shard(pieces, shard_count=count, cur_shard=shard, **common)  # type: ignore[arg-type]
            assert list(staged.segments) == list(plain.segments)
            assert (staged.rows, staged.batches) == (plain.rows, plain.batches)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("trial", range(12))
def test_every_row_once_across_resizes(shuffle: bool, drop_last: bool, trial: int) -> None:
    rng = np.random.default_rng([trial, shuffle, drop_last])
    pieces = [int(n) for n in rng.integers(1, 30, size=int(rng.integers(1, 9)))]
    total = sum(pieces)
    batch_size = min(int(rng.integers(1, 5)), total)
    # e.g. 4 ranks -> 2 -> 3; across the trials every size from 1 to 8 stops and resumes.
    sizes = [trial % 8 + 1, 8 - trial % 8, int(rng.integers(1, 9))]
    while drop_last and total < max(sizes) * batch_size:
        batch_size = max(1, batch_size - 1)
        sizes = [min(s, total // batch_size) for s in sizes]
    order = dict(
        batch_size=batch_size,
        drop_last=drop_last,
        epoch=int(rng.integers(0, 4)),
        seed=11,
        shuffle=shuffle,
        window=int(rng.integers(1, 4)),
    )
    reads: Counter[int] = Counter()
    stages: list = []
    pool = set(range(total))  # what the epoch has still to read (drop_last leaves some out)
    for number, count in enumerate(sizes):
        last = number == len(sizes) - 1
        probe, _ = run_stage(pieces, stages, count, [0] * count, **order)
        rows, batches = probe[0].rows, probe[0].batches
        # A kill at a random step: ranks in step (DDP) or not, each at a batch boundary.
        if last:
            stop = None
        elif trial % 2:
            stop = [min(int(rng.integers(0, batches + 1)) * batch_size, rows)] * count
        else:
            stop = [min(int(rng.integers(0, batches + 1)) * batch_size, rows) for _ in range(count)]
        plans, served = run_stage(pieces, stages, count, stop, **order)
        # The stage reads the rest of the epoch in the epoch's global order, in equal shares.
        left = sorted(pool)
        stream = [p for plan in plans for p in plan_positions(plan)]
        if drop_last:
            assert rows == (len(left) // (count * batch_size)) * batch_size
            assert stream == left[: count * rows]
        else:
            assert rows == -(-len(left) // count)
            assert stream == ([left[i % len(left)] for i in range(count * rows)] if left else [])
        new = [p for shard in served for p in shard]
        reads.update(new)
        pool = set(stream) - set(new)
        if stop is not None:
            stages.append((count, tuple(stop)))
        assert all(len(plan_positions(plan)) == rows for plan in plans)
    if drop_last:
        assert max(reads.values(), default=1) == 1  # nothing twice
        # Each stage leaves out fewer than one batch per shard so that every batch is full.
        assert total - len(reads) < sum(count * batch_size for count in sizes)
    else:
        assert set(reads) == set(range(total))  # nothing skipped
        # Only padding repeats rows: fewer than one row per shard of each stage.
        assert sum(reads.values()) - total < sum(sizes)


def plan_positions(plan: StagePlan) -> list[int]:
    """The positions a plan reads, in segment order (before the window mixing)."""
    return [int(p) for s in plan.segments for p in plan.order.segment_positions(s)]


def test_exactly_once_when_shares_divide() -> None:
    pieces = [12, 12, 12, 12]  # 48 rows: 4 shards of 12, then 2 and 3 share the rest evenly
    order = dict(batch_size=2, drop_last=False, epoch=1, seed=3, shuffle=True, window=2)
    _, first = run_stage(pieces, [], 4, [6] * 4, **order)
    plans, second = run_stage(pieces, [(4, (6,) * 4)], 2, [6, 6], **order)
    assert plans[0].rows == 12
    _, third = run_stage(pieces, [(4, (6,) * 4), (2, (6, 6))], 3, None, **order)
    reads = Counter(p for stage in (first, second, third) for shard in stage for p in shard)
    assert sorted(reads) == list(range(48)) and set(reads.values()) == {1}


def test_next_epoch_is_unchanged_by_a_resize() -> None:
    pieces = [9, 4, 17, 3]
    order = dict(batch_size=3, drop_last=False, seed=8, shuffle=True, window=2)
    for shard in range(3):
        after = plan_stage(pieces, stages=[], shard_count=3, shard=shard, epoch=5, **order)  # type: ignore[arg-type]
        plain = plan_shard(pieces, shard_count=3, cur_shard=shard, epoch=5, batch_size=3, seed=8)
        assert list(after.segments) == list(plain.segments)


def test_states_merge_into_one_place_for_any_size() -> None:
    config = {"rows": 10}
    states = [
        resume_state.shard_state(config, epoch=2, stages=[], shard_count=3, shard=s, rows=4, end=3)
        for s in (2, 0, 1)
    ]
    merged = resume_state.merge(states)
    assert merged["stages"] == [[3, [4, 4, 4]]] and merged["epoch"] == 2
    assert resume_state.merge([merged]) == merged
    epoch, stages, skip, end = resume_state.pending(
        states, config=config, shard_count=5, shard=4, what="loader"
    )
    assert (epoch, stages, skip, end) == (2, [(3, (4, 4, 4))], 0, 3)
    own = resume_state.pending(states[1], config=config, shard_count=3, shard=0, what="loader")
    assert own == (2, [], 4, 3)


@pytest.mark.parametrize(
    "states, match",
    [
        ("states[:2]", r"cover shards \[0, 2\] of 3; pass the state of every rank"),
        ("states[0]", r"shard 2 of 3 alone, but this rank is shard 0 of 2"),
        ("mixed", r"epoch differs: 2 and 3\); save the states of all ranks at the same step"),
        ("{'x': 1}", r"not a sparktrain loader state"),
        ("other", r"other settings or data \(rows: saved 11, now 10\)"),
    ],
)
def test_incomplete_or_foreign_states_are_refused(states: str, match: str) -> None:
    config = {"rows": 10}
    made = [
        resume_state.shard_state(
            config, epoch=2, stages=[], shard_count=3, shard=s, rows=4, end=None
        )
        for s in (2, 0, 1)
    ]
    given = {
        "states[:2]": made[:2],
        "states[0]": made[0],
        "mixed": [made[0], {**made[1], "epoch": 3}, made[2]],
        "{'x': 1}": {"x": 1},
        "other": [{**s, "config": {"rows": 11}} for s in made],
    }[states]
    with pytest.raises(ConfigurationError, match=match):
        resume_state.pending(given, config=config, shard_count=2, shard=0, what="loader")


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_resumes_at_another_size(shuffle: bool, drop_last: bool) -> None:
    from sparktrain.data import ResumableDistributedSampler

    size = 97
    options = dict(shuffle=shuffle, seed=3, drop_last=drop_last)
    old = [ResumableDistributedSampler(size, 4, rank, **options) for rank in range(4)]  # type: ignore[arg-type]
    first_seven: list[int] = []
    for sampler in old:
        sampler.set_epoch(2)
        it = iter(sampler)
        taken = [next(it) for _ in range(10)]
        first_seven.extend(taken[:7])
    # A DataLoader's workers took indices ahead: the state says what was trained (7 each).
    states = [sampler.state_dict(consumed=7) for sampler in old]
    assert [state["rows"] for state in states] == [7] * 4
    new = [ResumableDistributedSampler(size, 3, rank, **options) for rank in range(3)]  # type: ignore[arg-type]
    rest: list[int] = []
    for sampler in new:
        sampler.load_state_dict(states)
        sampler.set_epoch(2)  # the usual DDP loop: the restored epoch keeps its place
        assert len(sampler) == len(list(iter(sampler)))
        sampler.load_state_dict(states)
        rest.extend(sampler)
    reads = Counter(first_seven + rest)
    if drop_last:
        assert max(reads.values()) == 1 and size - len(reads) < 4 + 3
    else:
        assert sorted(reads) == list(range(size))
        assert sum(reads.values()) - size < 4 + 3  # only padding repeats
    # The next epoch is what an uninterrupted sampler at the new size gives.
    for rank, sampler in enumerate(new):
        sampler.set_epoch(3)
        plain = ResumableDistributedSampler(size, 3, rank, **options)  # type: ignore[arg-type]
        plain.set_epoch(3)
        assert list(sampler) == list(plain)


@pytest.mark.parametrize(
    "stages", [[[2, [4]]], [[0, []]], [[2, [4, -1]]], [["2", [4, 4]]], [[2]], "x"]
)
def test_damaged_stages_are_refused(stages: object) -> None:
    config = {"rows": 10}
    state = resume_state.shard_state(
        config, epoch=1, stages=[], shard_count=2, shard=0, rows=0, end=None
    )
    merged = {**resume_state.merge([state, {**state, "shard": 1}]), "stages": stages}
    with pytest.raises(ConfigurationError, match=r"the loader state is damaged"):
        resume_state.pending(merged, config=config, shard_count=3, shard=0, what="loader")


def test_sampler_in_a_torch_dataloader() -> None:
    import torch

    from sparktrain.data import ResumableDistributedSampler

    dataset = torch.utils.data.TensorDataset(torch.arange(50))
    taken: list[int] = []
    states = []
    for rank in range(2):
        sampler = ResumableDistributedSampler(dataset, 2, rank, seed=9)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
        it = iter(loader)
        taken += [int(i) for _ in range(3) for i in next(it)[0]]
        states.append(sampler.state_dict())  # no worker processes: what the loop took
    assert [state["rows"] for state in states] == [12, 12]
    sampler = ResumableDistributedSampler(dataset, 1, 0, seed=9)
    sampler.load_state_dict(states)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    assert len(loader) == 7  # 26 indices left
    rest = [int(i) for batch in loader for i in batch[0]]
    assert sorted(taken + rest) == list(range(50))
